#!/usr/bin/env python3
# hotlines.py -- the distinct 64-byte code lines a loop runs every iteration,
# from a callgrind profile taken with per-instruction positions:
#
#   valgrind --tool=callgrind --dump-instr=yes --dump-line=no \
#     --compress-strings=no --compress-pos=no --callgrind-out-file=A.cg \
#     target/release/examples/post_poll_cost 3000 reserved typed
#   python3 bench/hotlines.py 3000 A.cg [B.cg]
#
# An instruction executed at least ITERS times (once per iteration on
# average) is hot; its line is counted once. That is the code an iteration
# has to fetch when something else (the kernel, between system calls) has
# evicted the instruction cache: the footprint, without the refetches a
# small simulated cache adds. By function (the function whose code holds
# the line), and with a second profile the change per function.
import collections
import re
import sys


def hot_lines(path, iters):
    per_fn = collections.defaultdict(set)
    fn = "?"
    skip = False
    for line in open(path, errors="replace"):
        if line.startswith("fn="):
            fn = line[3:].strip()
            continue
        if line.startswith("calls="):
            skip = True  # the next cost line is the call's inclusive cost
            continue
        m = re.match(r"0x([0-9a-f]+) (\d+)", line)
        if not m:
            continue
        if skip:
            skip = False
            continue
        if int(m.group(2)) >= iters:
            per_fn[fn].add(int(m.group(1), 16) >> 6)
    return per_fn


def short(name):
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    return name[:140]


def main():
    iters = int(sys.argv[1])
    a = hot_lines(sys.argv[2], iters)
    total_a = len(set().union(*a.values())) if a else 0
    print(f"{sys.argv[2]}: {total_a} distinct hot lines ({total_a * 64} bytes)")
    if len(sys.argv) < 4:
        for f, s in sorted(a.items(), key=lambda kv: -len(kv[1]))[:25]:
            print(f"{len(s):5d} {short(f)}")
        return
    b = hot_lines(sys.argv[3], iters)
    total_b = len(set().union(*b.values())) if b else 0
    print(f"{sys.argv[3]}: {total_b} distinct hot lines ({total_b * 64} bytes), "
          f"{total_b - total_a:+d} ({(total_b / total_a - 1) * 100 if total_a else 0:+.1f} %)")
    ca = collections.Counter({short(f): len(s) for f, s in a.items()})
    cb = collections.Counter({short(f): len(s) for f, s in b.items()})
    for f in sorted(set(ca) | set(cb), key=lambda k: -abs(cb[k] - ca[k]))[:30]:
        print(f"{ca[f]:5d} {cb[f]:5d} {cb[f] - ca[f]:+5d} {f}")


main()
