"""The multi-matrix GEMV (native/cuda/gemv.cu): fd_gemv_multi, what CudaOps.linear_multi runs for the q, k
and v projections of decode steps and verify rows (fused RMSNorm, bias), checked against float64 numpy on
gguf-dequantized weights before it is timed. bench_gemv.py covers fd_gemv and fd_gemv_swiglu, one matrix
per launch.

    python bench/bench_gemv_multi.py [--seed N] [--reps 50] [--quick] [--n-x 1,8,16,32] [--paths rows,dp4a]
                                     [--tuning FIELD=N,...]

Shapes: the QKV of Qwen2.5-Coder-1.5B (hidden 1536: q 1536 rows Q4_K, k 256 Q4_K, v 256 Q6_K, as in the
Q4_K_M file) and 0.5B (hidden 896: q 896 Q5_0, k 128 Q5_0, v 128 Q8_0), at n_x = 1, 2, 4, 8, 16 input
rows (a decode step, then chains / trees of verify rows; above GEMV_MAX_ROWS = 8 CudaOps.linear_multi
launches once per group of 8, and so does this benchmark), plus an awkward one (cols 2080 = 65 blocks
of 32, not a multiple of 256: q 333 rows Q8_0, k 37 Q5_0, v 37 Q4_0; n_x = 3). --quick: n_x = 1 and 8.
--paths rows,dp4a times every case twice, side by side: with the tuning's gemv_rows on (native/cuda/gemv_rows.cuh
for Q4_K / Q6_K / Q8_0 / Q5_0 launches, groups of up to 32 rows; its table value, else 1) and off (gemv.cuh's kernels,
groups of 8); the case name ends in [rows] / [dp4a]. A launch on gemv_rows.cuh quantizes xn to one int8 code per
column (bound / 254 instead of / (127 * 2 * 254): tests/gpu/test_gemv_rows.py). --tuning sets other fields first.
Each launch sequence is captured once in a CUDA graph and replayed (as in the captured decode step), L2
flushed before every repetition (bench/timing.py).

Tolerance (tests/gpu/test_gemv.py's, per element): 1e-5 * (|xn| @ |W|^T) + 1e-6 * |bias| + the int8
activation bound |W| @ (per column, max |xn| over its 32-column block) / (127 * 2 * 254) * 1.02: the
weights are exact; float32 sums over <= 9000 products and rsqrtf stay under 1e-5 of sum |W||xn|, and
quantized launches stage xn as int8 hi + lo codes per 32-column block.
GB/s counts what the launches move: every group of rows streams the weights again (n_x = 16 reads them
twice), plus x, y, the biases and the norm weight once per group.
"""
from __future__ import annotations

import argparse

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from flashd.bench.op_harness import OpHarness, Tolerance, op_parser
from flashd.daemon.backends.cuda.ops import GEMV_MAX_ROWS, GEMV_ROWS_MAX_ROWS, gemv_groups, gemv_rows_call

EPS = 1e-6
# name: (cols, [(qtype, rows)] for q, k, v); every matrix has a bias (Qwen2's q/k/v do)
SHAPES = {
    "qkv 1.5B": (1536, [(T.Q4_K, 1536), (T.Q4_K, 256), (T.Q6_K, 256)]),
    "qkv 0.5B": (896, [(T.Q5_0, 896), (T.Q5_0, 128), (T.Q8_0, 128)]),
}
N_XS = (1, 2, 4, 8, 16)
QUICK_N_XS = (1, 8)
AWKWARD = ("awkward", 2080, [(T.Q8_0, 333), (T.Q5_0, 37), (T.Q4_0, 37)], 3)   # (name, cols, mats, n_x)
XQ_DEN = 127 * 2 * 254
ROWS_XQ_DEN = 127 * 2
ROWS_XG = 128


def group_rows(tuning, mats, cols: int) -> int:
    """Rows a launch takes under `tuning` (NativeLib.tuning()), as CudaOps.gemv_group decides it."""
    return GEMV_ROWS_MAX_ROWS if gemv_rows_call(tuning, [q for q, _ in mats], cols) else GEMV_MAX_ROWS


def weight_bytes(qtype, rows: int, cols: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return rows * (cols // block) * size


def moved_bytes(mats, cols: int, n_x: int, group: int = GEMV_MAX_ROWS) -> int:
    """Bytes the launches of n_x rows move: per group, every weight, the biases, the norm weight, x and y."""
    w = sum(weight_bytes(q, r, cols) for q, r in mats)
    rows = sum(r for _, r in mats)
    return sum(w + 4 * rows + 4 * cols + 4 * (e - s) * (cols + rows) for s, e in gemv_groups(n_x, group))


def normed64(x, norm_w):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + EPS) * norm_w.astype(np.float64)


def x_block(qtypes) -> int:
    """Columns of one x scale on gemv_rows.cuh (gemv_rows_plan.cuh rows_fine), as tests/gpu/test_gemv.py's: 32 in a
    launch of one 32-column format (Q8_0 or Q5_0), else a 128-column group."""
    qs = {int(q) for q in qtypes}
    return 32 if len(qs) == 1 and qs <= {int(T.Q8_0), int(T.Q5_0)} else ROWS_XG


def int8_x_bound(xn, W, rows=False):
    """tests/gpu/test_gemv.py's: the int8-activation path's extra error (0 when cols % 32 != 0); rows: gemv_rows.cuh,
    one x scale a 128-column group (True) or a block of that many columns (an int: x_block)."""
    cols = xn.shape[-1]
    if cols % 32:
        return 0.0
    blk = 32 if rows is False else ROWS_XG if rows is True else int(rows)
    pad = -cols % blk
    a = np.abs(xn)
    if pad:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], pad))], -1)
    bmax = a.reshape(*a.shape[:-1], (cols + pad) // blk, blk).max(-1)
    return 1.02 * (np.repeat(bmax, blk, axis=-1)[..., :cols] @ np.abs(W).T) / (ROWS_XQ_DEN if rows else XQ_DEN)


def reference_and_bound(x, norm_w, Ws, biases, rows=False):
    """(y, bound): the float64 outputs of every matrix side by side (n_x, sum rows) and the per-element
    tolerance."""
    xn = normed64(x, norm_w)
    ys, bounds = [], []
    for W, b in zip(Ws, biases):
        ys.append(xn @ W.T + b)
        bounds.append(1e-5 * (np.abs(xn) @ np.abs(W).T) + 1e-6 * np.abs(b) + int8_x_bound(xn, W, rows))
    return np.concatenate(ys, axis=1), np.concatenate(bounds, axis=1)


def bench_case(h: OpHarness, name: str, cols: int, mats, n_x: int, tag: str = "") -> None:
    from gguf.quants import dequantize

    from flashd.scripts.random_weights import random_weights

    dev, lib, ffi, p = h.dev, h.dev.lib, h.dev.ffi, h.dev.p
    tuning = dev.native.tuning()
    on_rows = gemv_rows_call(tuning, [q for q, _ in mats], cols)
    group = group_rows(tuning, mats, cols)
    base = f"fd_gemv_multi {name} {'+'.join(f'{q.name}:{r}' for q, r in mats)}x{cols} n_x={n_x}"
    case = base + (f" [{tag}]" if tag else "")
    rng = h.rng(base)                                      # the same inputs for every path
    datas = [random_weights(rng, q, r, cols) for q, r in mats]
    Ws = [dequantize(d, q).reshape(r, cols).astype(np.float64) for d, (q, r) in zip(datas, mats)]
    biases = [rng.standard_normal(r).astype(np.float32) for _, r in mats]
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    want, bound = reference_and_bound(x, norm_w, Ws, biases, x_block([q for q, _ in mats]) if on_rows else False)

    ws = [dev.upload(d) for d in datas]
    bs = [dev.upload(b) for b in biases]
    xd, nd = dev.upload(x), dev.upload(norm_w)
    ys = [dev.empty((n_x, r)) for _, r in mats]
    for y in ys:
        dev.fill_bytes(y, 0xFF)                              # NaN: an unwritten output fails the check
    c_w = ffi.new("void*[]", [p(w) for w in ws])
    c_q = ffi.new("int[]", [int(q) for q, _ in mats])
    c_r = ffi.new("int[]", [r for _, r in mats])
    c_b = ffi.new("float*[]", [p(b, "float*") for b in bs])
    groups = [(s, e, ffi.new("float*[]", [p(y[s:e], "float*") for y in ys])) for s, e in gemv_groups(n_x, group)]

    def launch():
        for s, e, c_y in groups:
            status = lib.fd_gemv_multi(len(mats), c_y, c_w, c_q, c_r, c_b, cols, p(xd[s:e], "float*"), e - s,
                                       p(nd, "float*"), EPS, dev.stream)
            if status:
                return status
        return 0

    h.run(case, launch, lambda: np.concatenate([dev.download(y) for y in ys], axis=1), lambda: want,
          Tolerance("exact weights; float32 sums and rsqrtf within 1e-5 of sum |W||xn|; " +
                    ("one int8 activation code a column (tests/gpu/test_gemv_rows.py)" if on_rows else
                     "int8 hi + lo activation codes (tests/gpu/test_gemv.py)"), atol=bound),
          n_bytes=moved_bytes(mats, cols, n_x, group), graph=True)


def build_parser() -> argparse.ArgumentParser:
    ap = op_parser(__doc__, "n_x = 1 and 8 only, no awkward shape", reps=50)
    ap.add_argument("--n-x", default="", help="x-row counts (default 1,2,4,8,16; e.g. 1,8,16,32)")
    ap.add_argument("--paths", default="", help="rows,dp4a: every case with gemv_rows on and off, side by side")
    ap.add_argument("--tuning", default="", metavar="FIELD=N,...", help="launch tuning overrides (flashd_tuning.h)")
    return ap


def path_variants(native, paths: str) -> list:
    """[(tag, tuning changes)]: the tuning as set (''), or gemv_rows on ('rows': the table's value, else 1) / off."""
    if not paths:
        return [("", {})]
    on = native.tuning().get("gemv_rows", 0) or 1
    table = {"rows": {"gemv_rows": on}, "dp4a": {"gemv_rows": 0}}
    return [(p, table[p]) for p in paths.split(",")]


def main(argv=None) -> None:
    from flashd.daemon.bench_cli import parse_tuning

    args = build_parser().parse_args(argv)
    h = OpHarness.on_gpu(args)
    native = h.dev.native
    native.set_tuning(**parse_tuning(args.tuning))
    variants = path_variants(native, args.paths)
    n_xs = [int(v) for v in args.n_x.split(",")] if args.n_x else (QUICK_N_XS if args.quick else N_XS)
    cases = [(name, cols, mats, n_x) for name, (cols, mats) in SHAPES.items() for n_x in n_xs]
    if not args.quick:
        cases.append(AWKWARD)
    for name, cols, mats, n_x in cases:
        for tag, changes in variants:
            native.set_tuning(**changes)
            bench_case(h, name, cols, mats, n_x, tag)


if __name__ == "__main__":
    main()
