"""Where a kernel's warps stall, by SASS instruction: a summary of `ncu --page source --csv --print-source sass`
(bench/lab; not a test). ncu samples each warp's state at intervals; the samples of one instruction say why warps
sat there (long_sb: waiting on a global load, barrier, short_sb: shared memory, imc / no_inst: instruction or
constant cache misses, math: pipe throttle).

    ncu -k regex:NAME --launch-skip N --launch-count K --section SourceCounters --section WarpStateStats \\
        -o rep -f <command>
    ncu --import rep.ncu-rep --page source --csv --print-source sass > src.csv
    python bench/lab/ncu_source_top.py src.csv [--top 25]

Prints, per profiled launch (ncu writes one block of rows per launch, each under its own header row), the samples
summed by opcode and the top instructions with their three largest stall reasons."""
from __future__ import annotations

import argparse
import collections
import csv


def blocks(rows: list[list[str]]):
    """(header, data rows) per launch; a header row names the Source column and a sampling column."""
    out, header, cur = [], None, None
    for r in rows:
        if not r:
            continue
        if any(c.strip() == "Source" for c in r) and any("Sampl" in c for c in r):
            header, cur = [c.strip() for c in r], []
            out.append((header, cur))
        elif cur is not None and len(r) == len(header) and r[header.index("Source")].strip():
            cur.append(r)
    return out


def num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(src: str) -> str:
    words = src.strip().split()
    if words and words[0].startswith("@"):          # a predicate
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def summarize(header: list[str], data: list[list[str]], top: int) -> list[str]:
    src = header.index("Source")
    si = next(i for i, h in enumerate(header) if "Sampling" in h and "All" in h) \
        if any("Sampling" in h and "All" in h for h in header) else next(i for i, h in enumerate(header) if "Sampl" in h)
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_")]
    total = sum(num(r[si]) for r in data) or 1.0
    lines = [f"{len(data)} instructions, {total:.0f} samples"]
    ops = collections.Counter()
    for r in data:
        ops[opcode(r[src])] += num(r[si])
    lines.append("by opcode: " + ", ".join(f"{k} {v / total * 100:.1f}%" for k, v in ops.most_common(14)))
    best = sorted(range(len(data)), key=lambda i: -num(data[i][si]))[:top]
    for i in sorted(best):
        r = data[i]
        why = sorted(((num(r[c]), header[c]) for c in reasons), reverse=True)[:3]
        lines.append(f"{i:5d} {num(r[si]) / total * 100:5.1f}%  {r[src].strip()[:60]:60s} "
                     + " ".join(f"{h.replace('stall_', '')}={v:.0f}" for v, h in why if v))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    found = blocks(list(csv.reader(open(args.csv, errors="replace"))))
    seen = set()
    for k, (header, data) in enumerate(found):
        key = tuple(tuple(r) for r in data)
        if key in seen:                                 # ncu repeats a launch's block under a second header
            continue
        seen.add(key)
        print(f"\n== launch {k}")
        print("\n".join(summarize(header, data, args.top)))


if __name__ == "__main__":
    main()
