"""Decode-projection GEMV bandwidth at the shapes of Qwen2.5-Coder-1.5B / 0.5B, per weight format.

    python bench/bench_gemv.py [--reps 50] [--formats Q4_K,Q6_K,...] [--quick] [--n-x 2,4,8]
                               [--paths rows,dp4a] [--tuning FIELD=N,...]

Two timings per case (median of --reps):
  single  one fd_gemv between two events, L2 flushed before each repetition (bench/timing.py). For a
          few-MB matrix this includes the launch latency and the ramp-up of one kernel.
  graph   a CUDA graph of back-to-back fd_gemv launches cycling through enough copies of the weight
          to overflow L2 (so each launch streams from DRAM), time per launch. This is how a captured
          decode step runs: launches back to back, no host gaps.
--n-x: the x-row counts of the ffn_gate/up sweep (default 2,4,8; e.g. 1,8,16,32 -- also every shape then).
--paths rows,dp4a times every case twice, side by side: gemv_rows on (native/cuda/gemv_rows.cuh for Q4_K / Q6_K /
Q8_0, up to 32 rows a launch; the table's value, else 1) and off (gemv.cuh's kernels, 8 rows a launch: more rows
take several launches, as CudaOps runs them); names end in [rows] / [dp4a]. --tuning sets other fields first.
GB/s counts the bytes the kernel must move (weights + x + y); % is of the DRAM peak from the device
attributes. A device-to-device copy is timed first as the practically reachable bandwidth.
"""
from __future__ import annotations

import argparse

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from flashd.bench.timing import KernelTimer, report
from flashd.daemon.backends.cuda.lib import load
from flashd.daemon.backends.cuda.ops import GEMV_MAX_ROWS, GEMV_ROWS_MAX_ROWS, gemv_groups, gemv_rows_call
from flashd.daemon.backends.cuda.tensor import Device
from flashd.scripts.random_weights import random_weights

FORMATS = {"Q4_K": T.Q4_K, "Q6_K": T.Q6_K, "Q5_0": T.Q5_0, "Q8_0": T.Q8_0, "F16": T.F16}
# (label, rows, cols): Qwen2.5-Coder-1.5B (hidden 1536, ffn 8960, 2 kv heads x 128) and 0.5B (896, 4864)
SHAPES_1_5B = [("ffn_gate/up 1.5B", 8960, 1536), ("ffn_down 1.5B", 1536, 8960), ("lm_head 1.5B", 151936, 1536),
               ("attn_q/o 1.5B", 1536, 1536), ("attn_k/v 1.5B", 256, 1536)]
SHAPES_0_5B = [("ffn_gate/up 0.5B", 4864, 896), ("ffn_down 0.5B", 896, 4864), ("lm_head 0.5B", 151936, 896),
               ("attn_k/v 0.5B", 128, 896)]
GRAPH_WORKING_SET = 160 << 20   # > the L2 of H100 (50 MB) / H200 (60 MB) with room


def supported(qtype, cols) -> bool:
    return qtype == T.F16 or cols % GGML_QUANT_SIZES[qtype][0] == 0


class Bench:
    def __init__(self, reps: int):
        self.native = load()
        self.dev = Device(self.native)
        self.timer = KernelTimer(self.dev)
        self.reps = reps
        self.ffi, self.lib = self.native.ffi, self.native.lib
        self.rng = np.random.default_rng(0)

    def check(self, st, what):
        self.native.check(st, what)

    def copy_bandwidth(self) -> None:
        n = 512 << 20
        a, b = self.dev.empty(n // 4), self.dev.empty(n // 4)
        ms = self.timer.time(lambda: self.lib.fd_memcpy_d2d(self.dev.p(b), self.dev.p(a), n, self.dev.stream),
                             reps=20, flush=False)
        print(report("device-to-device copy 512 MB (read + write)", ms, n_bytes=2 * n, peak_gbs=self.timer.peak_gbs))

    def group(self, qtypes, cols) -> int:
        """Rows a launch takes under the tuning in effect (CudaOps.gemv_group)."""
        on = gemv_rows_call(self.native.tuning(), qtypes, cols)
        return GEMV_ROWS_MAX_ROWS if on else GEMV_MAX_ROWS

    def gemv_fn(self, y, w, qtype, rows, cols, x, n_x, norm):
        """One fd_gemv per group of rows (one launch up to the group size)."""
        dev, lib = self.dev, self.lib
        pw, pn, N = dev.p(w), dev.p(norm, "float*"), self.ffi.NULL
        calls = [(dev.p(y[s:e], "float*"), dev.p(x[s:e], "float*"), e - s)
                 for s, e in gemv_groups(n_x, self.group([qtype], cols))]

        def run():
            for py, px, n in calls:
                st = lib.fd_gemv(py, pw, int(qtype), rows, cols, px, n, pn, 1e-6, N, N, dev.stream)
                if st:
                    return st
            return 0
        return run

    def graph_ms(self, fns: list) -> float:
        """Median time per launch of a graph that runs fns back to back (each once)."""
        dev, lib, ffi = self.dev, self.lib, self.ffi
        self.check(lib.fd_graph_begin_capture(dev.stream), "begin capture")
        for fn in fns:
            self.check(fn(), "gemv in capture")
        g = ffi.new("void**")
        self.check(lib.fd_graph_end_capture(dev.stream, g), "end capture")
        ms = self.timer.time(lambda: lib.fd_graph_launch(g[0], dev.stream), reps=max(5, self.reps // 5), flush=False)
        lib.fd_graph_destroy(g[0])
        return ms / len(fns)

    def case(self, label, qtype, rows, cols, n_x=1, norm=True, tag="") -> None:
        dev = self.dev
        data = random_weights(self.rng, qtype, rows, cols)
        w_bytes = data.nbytes
        n_copies = max(1, min(32, -(-GRAPH_WORKING_SET // w_bytes)))
        ws = [dev.upload(data) for _ in range(n_copies)]
        x = dev.upload(self.rng.standard_normal((n_x, cols), dtype=np.float32))
        norm_w = dev.upload(np.ones(cols, np.float32)) if norm else None
        y = dev.empty((n_x, rows))
        fns = [self.gemv_fn(y, w, qtype, rows, cols, x, n_x, norm_w) for w in ws]
        self.check(fns[0](), "fd_gemv")
        moved = w_bytes + 4 * n_x * (cols + rows)
        name = f"{label} {qtype.name} {rows}x{cols} n_x={n_x}" + (f" [{tag}]" if tag else "")
        ms = self.timer.time(fns[0], reps=self.reps)
        print(report(name + " single", ms, n_bytes=moved, peak_gbs=self.timer.peak_gbs), flush=True)
        if n_copies > 1:
            gms = self.graph_ms(fns * max(1, 64 // n_copies))
            print(report(name + f" graph({n_copies}x)", gms, n_bytes=moved, peak_gbs=self.timer.peak_gbs), flush=True)
        del ws

    def swiglu_case(self, qtype, rows, cols, n_x=1, tag="") -> None:
        dev, lib, ffi = self.dev, self.lib, self.ffi
        dg, du = random_weights(self.rng, qtype, rows, cols), random_weights(self.rng, qtype, rows, cols)
        n_copies = max(1, min(16, -(-GRAPH_WORKING_SET // (2 * dg.nbytes))))
        pairs = [(dev.upload(dg), dev.upload(du)) for _ in range(n_copies)]
        x = dev.upload(self.rng.standard_normal((n_x, cols), dtype=np.float32))
        norm_w = dev.upload(np.ones(cols, np.float32))
        y = dev.empty((n_x, rows))

        groups = list(gemv_groups(n_x, self.group([qtype, qtype], cols)))

        def fn(g, u):
            def run():
                for s, e in groups:
                    st = lib.fd_gemv_swiglu(dev.p(y[s:e], "float*"), dev.p(g), int(qtype), dev.p(u), int(qtype), rows,
                                            cols, dev.p(x[s:e], "float*"), e - s, dev.p(norm_w, "float*"), 1e-6,
                                            dev.stream)
                    if st:
                        return st
                return 0
            return run
        fns = [fn(g, u) for g, u in pairs]
        self.check(fns[0](), "fd_gemv_swiglu")
        moved = 2 * dg.nbytes + 4 * n_x * (cols + rows)
        name = f"swiglu gate+up {qtype.name} 2x{rows}x{cols} n_x={n_x}" + (f" [{tag}]" if tag else "")
        print(report(name + " single", self.timer.time(fns[0], reps=self.reps), n_bytes=moved,
                     peak_gbs=self.timer.peak_gbs), flush=True)
        print(report(name + f" graph({n_copies}x)", self.graph_ms(fns * max(1, 64 // n_copies)), n_bytes=moved,
                     peak_gbs=self.timer.peak_gbs), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--quick", action="store_true", help="only the 1.5B shapes at n_x = 1")
    ap.add_argument("--n-x", default="", help="x-row counts of the sweep (default 2,4,8; with 1 in it every shape "
                                              "runs at each)")
    ap.add_argument("--paths", default="", help="rows,dp4a: every case with gemv_rows on and off, side by side")
    ap.add_argument("--tuning", default="", metavar="FIELD=N,...", help="launch tuning overrides (flashd_tuning.h)")
    args = ap.parse_args(argv)
    from flashd.daemon.bench_cli import parse_tuning

    b = Bench(args.reps)
    b.native.set_tuning(**parse_tuning(args.tuning))
    info = b.timer.info
    print(f"# {info['name']} cc {info['cc']}, {info['n_sms']} SMs, DRAM peak {b.timer.peak_gbs:.0f} GB/s")
    print("# tuning: " + ", ".join(f"{k}={v}" for k, v in b.native.tuning().items()))
    b.copy_bandwidth()
    on = b.native.tuning().get("gemv_rows", 0) or 1
    variants = [(p, {"rows": {"gemv_rows": on}, "dp4a": {"gemv_rows": 0}}[p]) for p in args.paths.split(",")] \
        if args.paths else [("", {})]

    def each(fn, *a, **kw):
        for tag, changes in variants:
            b.native.set_tuning(**changes)
            fn(*a, tag=tag, **kw)

    formats = [FORMATS[f] for f in args.formats.split(",")]
    shapes = SHAPES_1_5B if args.quick else SHAPES_1_5B + SHAPES_0_5B
    n_xs = [int(v) for v in args.n_x.split(",")] if args.n_x else [2, 4, 8]
    every_shape_n = n_xs if 1 in n_xs else [1]
    for qtype in formats:
        for label, rows, cols in shapes:
            if supported(qtype, cols):
                for n_x in every_shape_n:
                    each(b.case, label, qtype, rows, cols, n_x=n_x)
    if not args.quick:
        for qtype in formats:
            for n_x in (n for n in n_xs if n not in every_shape_n):
                each(b.case, "ffn_gate/up 1.5B", qtype, 8960, 1536, n_x=n_x)
        for qtype in (T.Q4_K, T.Q5_0):
            cols = 1536 if qtype == T.Q4_K else 896
            rows = 8960 if qtype == T.Q4_K else 4864
            for n_x in every_shape_n:
                each(b.swiglu_case, qtype, rows, cols, n_x=n_x)


if __name__ == "__main__":
    main()
