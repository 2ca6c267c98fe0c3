"""Daemon start-up: seconds from process start to the `ready` event, and the same for a second
`flashd generate` on a resident daemon (no load at all).

    python bench/bench_startup.py --model qwen2.5-coder-1.5b [--device cuda] [--runs 3] [--out bench/results/]

Each run starts `python -m flashd.daemon --model M --device D` (stdin dialect), waits for its ready
line on stdout, then sends `quit`. The build cache must be warm (run once before: the first CUDA run
may compile the library). Also reported: the daemon's own "loaded ... in X s" (model + tokenizer +
weights + graphs, without interpreter start-up and imports), `Tokenizer.from_gguf` alone (in this
process; the test suite checks only that it takes the bulk header parser, never gguf.GGUFReader:
~0.6 s vs ~10 s for a 151936-token vocabulary on a 2-core machine), and the resident path: two
consecutive `flashd generate -n 1` commands with --keep-alive, the second of which only connects.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flashd.bench.out_files import commit_label

LOADED = re.compile(r"loaded .* in ([0-9.]+) s")


def start_once(model: str, device: str) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flashd.daemon", "--model", model, "--device", device,
                             "--log-level", "info"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    ready_s = time.perf_counter() - t0
    proc.stdin.write("quit\n")
    proc.stdin.close()
    err = proc.stderr.read()
    proc.wait(60)
    if not line.startswith("{") or json.loads(line).get("event") != "ready":
        raise SystemExit(f"the daemon did not get ready:\n{err[-2000:]}")
    match = LOADED.search(err)
    return ready_s, float(match.group(1)) if match else None


def tokenizer_once(model: str) -> float:
    """Seconds of Tokenizer.from_gguf on the model's file (resolved first, not timed)."""
    from flashd.clients.registry import resolve_model
    from flashd.clients.tokenizer import Tokenizer

    path = resolve_model(model, progress=False)
    t0 = time.perf_counter()
    Tokenizer.from_gguf(path)
    return time.perf_counter() - t0


def resident_pair(model: str, device: str) -> tuple[float, float]:
    """Wall seconds of two consecutive `flashd generate -n 1` on a fresh resident daemon."""
    env = {**os.environ, "FLASHD_RUNTIME_DIR": tempfile.mkdtemp(prefix="fdrt-")}
    cmd = [sys.executable, "-m", "flashd.clients.cli", "generate", "x", "--model", model, "--device", device,
           "-n", "1", "-q", "--keep-alive", "60"]
    times = []
    try:
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=900)
            times.append(time.perf_counter() - t0)
    finally:
        subprocess.run([sys.executable, "-m", "flashd.clients.cli", "stop"], env=env, capture_output=True, timeout=60)
    return times[0], times[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF path or known model name")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--label", default=None, help="what was measured (e.g. a commit or a variant)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    start_once(args.model, args.device)                # warm-up: page cache, build cache
    runs = [start_once(args.model, args.device) for _ in range(args.runs)]
    ready = [r for r, _ in runs]
    loaded = [x for _, x in runs if x is not None]
    tokenizer = [tokenizer_once(args.model) for _ in range(args.runs)]
    first, second = resident_pair(args.model, args.device)
    commit = commit_label(Path(__file__).parent)
    lines = [f"# Daemon start-up: {Path(args.model).name}, device {args.device}", "",
             f"{datetime.date.today()}, commit {commit}{', ' + args.label if args.label else ''}, "
             f"{platform.node()} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)", "",
             "| what | median s | min s | runs |", "| --- | ---: | ---: | ---: |",
             f"| process start -> ready event | {statistics.median(ready):.2f} | {min(ready):.2f} | {len(ready)} |"]
    if loaded:
        lines.append(f"| daemon's own load (model, tokenizer, weights, graphs) | {statistics.median(loaded):.2f} | "
                     f"{min(loaded):.2f} | {len(loaded)} |")
    lines += [f"| `Tokenizer.from_gguf` alone (in process) | {statistics.median(tokenizer):.2f} | "
              f"{min(tokenizer):.2f} | {len(tokenizer)} |",
              f"| first `flashd generate -n 1` (starts the resident daemon) | {first:.2f} | | 1 |",
              f"| second `flashd generate -n 1` (resident: connects only) | {second:.2f} | | 1 |"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = Path(args.model).name.removesuffix(".gguf")
        path = args.out / f"{datetime.date.today()}-{args.device}-startup-{name}.md"
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
