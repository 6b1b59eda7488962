#!/usr/bin/env python3
"""Draw docs/kvcache/ttft_breakdown.png from kv_demo --json results.

usage: plot_ttft.py results.json out.png [results_prealloc.json]

Also prints the markdown TTFT table docs/kvcache.md quotes.

Left: time to first token per prompt length, stacked by phase, for RDMA
(WRITE WITH IMMEDIATE over rxe) and the TCP baseline. Right: the part of the
transfer that TTFT actually waits for (the tail after prefill compute ends)
next to the time the wire was busy, log scale.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = [
    ("handshake", "handshake (alloc + register + QP)", "#9e9e9e"),
    ("prefill_compute", "prefill compute", "#4c72b0"),
    ("transfer_tail", "transfer tail (after compute)", "#dd8452"),
    ("reconstruct", "reconstruct views", "#55a868"),
    ("first_decode_step", "first decode step", "#c44e52"),
]


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        docs = json.load(f)
    rows = []
    for d in docs:
        for r in d["runs"]:
            rows.append((d["prompt_tokens"], r["transport"], r))
    lens = sorted({n for n, _, _ in rows})
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.38
    for i, n in enumerate(lens):
        for j, t in enumerate(["rdma", "tcp"]):
            r = next((r for (m, tt, r) in rows if m == n and tt == t), None)
            if r is None:
                continue
            b = r["decode"]["ttft_breakdown_ms"]
            x = i + (j - 0.5) * width
            bottom = 0.0
            for key, label, color in PHASES:
                v = b[key] / 1e3
                ax.bar(x, v, width * 0.95, bottom=bottom, color=color,
                       label=label if (i == 0 and j == 0) else None,
                       hatch=None if t == "rdma" else "//", edgecolor="white")
                bottom += v
            ax.text(x, bottom, f"{t}\n{bottom:.2f}s", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(lens)))
    ax.set_xticklabels([f"{n} tokens" for n in lens])
    ax.set_ylabel("time to first token (s)")
    ax.set_title("TTFT breakdown (left bar RDMA, right bar TCP)")
    ax.legend(fontsize=8, loc="upper left")

    for j, t in enumerate(["rdma", "tcp"]):
        tails, busy = [], []
        for n in lens:
            r = next((r for (m, tt, r) in rows if m == n and tt == t), None)
            tails.append(max(r["decode"]["ttft_breakdown_ms"]["transfer_tail"], 1e-3) if r else 0)
            busy.append(max(r["prefill"]["transfer_busy_ms"], 1e-3) if r else 0)
        xs = [i + (j - 0.5) * width for i in range(len(lens))]
        bx.bar(xs, busy, width * 0.45, label=f"{t}: transfer busy",
               color="#4c72b0" if t == "rdma" else "#8172b2", align="edge")
        bx.bar([x - width * 0.45 for x in xs], tails, width * 0.45,
               label=f"{t}: tail TTFT waits for",
               color="#dd8452" if t == "rdma" else "#937860", align="edge")
    bx.set_yscale("log")
    bx.set_xticks(range(len(lens)))
    bx.set_xticklabels([f"{n} tokens" for n in lens])
    bx.set_ylabel("ms (log)")
    bx.set_title("KV transfer: wire-busy time vs. the tail after compute")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)
    table(docs)
    if len(sys.argv) > 3:
        with open(sys.argv[3]) as f:
            print()
            table(json.load(f))


def table(docs):
    print("| prompt | transport | KV MiB | TTFT ms | handshake | prefill compute | transfer tail | reconstruct | first step | tail share | wire busy ms | GB/s (busy) | stalls | = reference |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for d in docs:
        for r in d["runs"]:
            p, q = r["prefill"], r["decode"]
            b = q["ttft_breakdown_ms"]
            print(
                f"| {d['prompt_tokens']} | {r['transport']} | {p['kv_bytes'] / 2**20:.0f} | {q['ttft_ms']:.0f} "
                f"| {b['handshake']:.1f} | {b['prefill_compute']:.0f} | {b['transfer_tail']:.2f} "
                f"| {b['reconstruct']:.3f} | {b['first_decode_step']:.1f} | {100 * q['transfer_share_of_ttft']:.3f}% "
                f"| {p['transfer_busy_ms']:.1f} | {p['transfer_gb_per_s']:.2f} | {p['credit_stalls']} "
                f"| {'yes' if r['matches_reference'] else 'NO'} |"
            )


if __name__ == "__main__":
    main()
