"""What each kernel of a decode step adds to the step, from chain_trace.c's trace (bench/lab; not a test).

    python bench/lab/chain_report.py trace.tsv [--steps 32] [--marker decode_advance_kernel]

A step is the kernels from one marker kernel (the step's last, fd_decode_advance) to the next. With
programmatic dependent launch kernel k may start before k-1 ends; what it adds to the step is
end[k] - end[k-1] ("adds"), of which end[k] - max(start[k], end[k-1]) ran after its predecessor ended
("after"). Prints the median over the last --steps steps per position in the step, then sums per kernel name; and
the token wall (one marker's end to the next's) as median, mean, p90 and max, since a median hides slow steps.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import subprocess


def demangle(names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def short(name: str) -> str:
    for prefix in ("void ", "(anonymous namespace)::", "fd::", "attn::"):
        name = name.replace(prefix, "")
    return name.split("(")[0][:70]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--marker", default="decode_advance_kernel")
    args = ap.parse_args()
    rows = []
    with open(args.trace) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 6:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[5]))
    rows.sort(key=lambda r: r[1])                     # completion order = chain order
    names = demangle(sorted({r[4] for r in rows}))
    marks = [i for i, r in enumerate(rows) if args.marker in names[r[4]]]
    steps = [rows[a + 1:b + 1] for a, b in zip(marks, marks[1:])]
    if not steps:
        raise SystemExit("no complete step found")
    n = collections.Counter(len(s) for s in steps).most_common(1)[0][0]
    steps = [s for s in steps if len(s) == n][-args.steps:]
    print(f"{len(steps)} steps of {n} kernels; step (end to end) median "
          f"{statistics.median(s[-1][1] - s[0][1] + (s[0][1] - s[0][0]) for s in steps) / 1e3:.1f} us")
    # marker end to marker end (what a token costs, the gap between graphs included): a median hides a few slow
    # steps that a tok/s figure (a mean) counts
    walls = sorted((b[-1][1] - a[-1][1]) / 1e3 for a, b in zip(steps, steps[1:]))
    if walls:
        print(f"token wall (marker to marker) over {len(walls)}: median {statistics.median(walls):.1f} us, mean "
              f"{statistics.fmean(walls):.1f}, p90 {walls[int(0.9 * (len(walls) - 1))]:.1f}, max {walls[-1]:.1f}")
    prev_end = [None] * len(steps)
    per_name = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    print(f"{'#':>4} {'adds us':>8} {'after':>7} {'dur':>7} {'grid':>6} {'blk':>5}  kernel")
    total = 0.0
    for k in range(n):
        adds, after, dur = [], [], []
        for j, s in enumerate(steps):
            st, en = s[k][0], s[k][1]
            pe = s[k - 1][1] if k > 0 else (steps[j - 1][-1][1] if j > 0 else None)
            if pe is None:
                continue
            adds.append(en - pe)
            after.append(en - max(st, pe))
            dur.append(en - st)
        a, af, d = (statistics.median(v) / 1e3 if v else float("nan") for v in (adds, after, dur))
        total += a
        name = short(names[steps[-1][k][4]])
        e = per_name[name]
        e[0] += a; e[1] += af; e[2] += d; e[3] += 1
        if k < 16 or k >= n - 12:
            print(f"{k:4d} {a:8.2f} {af:7.2f} {d:7.2f} {steps[-1][k][2]:6d} {steps[-1][k][3]:5d}  {name}")
        elif k == 16:
            print("   ...")
    print(f"sum of medians {total:.1f} us")
    print(f"\n{'kernel':70s} {'count':>5} {'adds us':>9} {'after':>8} {'dur':>8} {'adds/launch':>11}")
    for name, (a, af, d, c) in sorted(per_name.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:70s} {c:5d} {a:9.1f} {af:8.1f} {d:8.1f} {a / c:11.2f}")


if __name__ == "__main__":
    main()
