"""Forward time against the number of rows (a decode step is 1 row; verifying d drafted tokens is d + 1):
the persistent forward (one launch) and the per-op graph path, side by side on one GPU.

Each row count's verify forward is captured as a CUDA graph (CudaRunner._tree_graph, a causal chain at
depth `--depth`) and replayed `--reps` times between two events; the table gives ms per forward, the
ratio to one row, the weight bytes streamed per second and that as a share of the measured device-copy
bandwidth (read + write bytes, the same yardstick flashd bench uses).

    python bench/bench_forward.py MODEL.gguf [--rows 1,2,4,8,16,32] [--depth 128] [--tuning gemv_rows=0] [--out DIR]

--tuning FIELD=N,... overrides the launch tuning (flashd_tuning.h) before anything is captured; the tuning in
effect is printed with the table (e.g. gemv_rows=0: every projection on gemv.cuh's kernels, in groups of 8 rows, to
compare with sm_90's default: Q4_K / Q6_K projections on gemv_rows.cuh in groups of up to 32; gemv_rows_formats=15
puts Q8_0 / Q5_0 there too).
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

from flashd.bench.out_files import commit_label, write_md_json


def time_rows(runner, n: int, depth: int, reps: int, rng) -> float:
    """ms per verify forward of n chained rows at `depth` cached tokens (graph replay)."""
    dev, lib, ffi = runner.dev, runner.dev.lib, runner.dev.ffi
    runner.reset()
    runner.prefill(rng.integers(100, runner.cfg.vocab_size - 100, depth).tolist())
    ids = rng.integers(100, runner.cfg.vocab_size - 100, n)
    mask = np.tril(np.ones((n, n), np.uint8))
    runner.forward_tree(ids, np.arange(depth, depth + n), mask)      # inputs uploaded; graph captured
    graph, _ = runner._tree_graph(n)
    ev = [ffi.new("void**"), ffi.new("void**")]
    for e in ev:
        dev.native.check(lib.fd_event_create(e, 1), "event")
    ms = ffi.new("float*")
    try:
        for _ in range(3):
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        lib.fd_event_record(ev[0][0], dev.stream)
        for _ in range(reps):
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        lib.fd_event_record(ev[1][0], dev.stream)
        dev.native.check(lib.fd_event_synchronize(ev[1][0]), "event sync")
        lib.fd_event_elapsed_ms(ms, ev[0][0], ev[1][0])
    finally:
        for e in ev:
            lib.fd_event_destroy(e[0])
    runner.reset()
    return ms[0] / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--depth", type=int, default=128, help="cached tokens before the rows")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--paths", default="persistent,graph")
    ap.add_argument("--tuning", default="", metavar="FIELD=N,...", help="launch tuning overrides (flashd_tuning.h)")
    ap.add_argument("--out", type=Path, help="directory for the .md and .json result")
    a = ap.parse_args(argv)

    from flashd.daemon.backends.cuda.backend import CudaBackend, measure_copy_gbs
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.models.weights import total_weight_bytes

    rows = [int(r) for r in a.rows.split(",")]
    from flashd.daemon.bench_cli import parse_tuning

    backend = CudaBackend()
    tuning = backend.device.native.set_tuning(**parse_tuning(a.tuning))   # before any graph is captured
    f, cfg = open_model(a.model)
    wbytes = total_weight_bytes(f, cfg) - f.tensor("token_embd.weight").n_bytes * (0 if cfg.tie_embeddings else 1)
    max_ctx = a.depth + max(rows) + 64
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, 512)
    lm = load_model((f, cfg), backend.ops.load_weight)
    copy_gbs = measure_copy_gbs(backend.device)
    rng = np.random.default_rng(0)
    results = {}
    info = {}
    for path in a.paths.split(","):
        backend.forward_path = path
        runner = backend.make_runner(cfg, lm.weights, max_ctx, 512, plan)
        if runner.forward_path != path:
            print(f"{path}: not available ({runner.forward_note})", file=sys.stderr)
            continue
        if runner.persistent is not None:
            info[path] = runner.persistent.info()
        results[path] = {n: time_rows(runner, n, a.depth, a.reps, rng) for n in rows}
        runner.close()
    gpu = backend.info()["name"]
    commit = commit_label()
    lines = [f"# Forward time vs rows: {cfg.name or Path(a.model).name}",
             "", f"{gpu}, {datetime.date.today()}, commit {commit}, depth {a.depth}, {a.reps} graph replays each; "
             f"weights streamed per forward {wbytes / 1e9:.3f} GB; device copy {copy_gbs:.0f} GB/s", "",
             "| path | rows | ms / forward | x one row | weight GB/s | % of copy bandwidth |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for path, res in results.items():
        base = res[rows[0]]
        for n in rows:
            gbs = wbytes / (res[n] * 1e-3) / 1e9
            lines.append(f"| {path} | {n} | {res[n]:.3f} | {res[n] / base:.2f} | {gbs:.0f} | {100 * gbs / copy_gbs:.1f} |")
    for path, i in info.items():
        lines.append(f"\n{path} plan: {i}")
    lines.append("\ntuning: " + ", ".join(f"{k}={v}" for k, v in tuning.items()))
    text = "\n".join(lines)
    print(text)
    if a.out:
        write_md_json(a.out, f"forward-rows-{Path(a.model).stem}", text + "\n",
                      {"gpu": gpu, "commit": commit, "depth": a.depth, "weight_bytes": wbytes, "copy_gbs": copy_gbs,
                       "ms": results, "plans": info, "tuning": tuning}, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
