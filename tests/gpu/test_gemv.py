"""fd_gemv, fd_gemv_multi, fd_gemv_swiglu against float64 numpy on gguf-dequantized weights.

Oracle: W = gguf.quants.dequantize(bytes) in float64; xn = x (or x / sqrt(mean(x^2) + eps) * norm_w)
in float64; y = xn @ W.T (+ bias) (+ residual).
Tolerance: |y - oracle| <= 1e-5 * (|xn| @ |W|.T) + 1e-6 * (|bias| + |residual|) + the int8-activation
bound. The kernel's weights are exact; its float32 sums run over <= 9000 products in chains of <= 32
plus a shuffle tree, and the norm scale uses rsqrtf (a few ulp): both stay well under 1e-5 of
sum |W||xn|. When every matrix of a launch is quantized, the kernel stages xn as int8 hi + lo codes
per 32-column block (gemv_stage.cuh stage_xq): each staged x' is within max|xn over its block| / (127 * 2 * 254) of
xn, so |y - oracle| gains at most |W| @ that (int8_x_bound). Calls on gemv_rows.cuh (tuning gemv_rows on, every
matrix Q4_K / Q6_K / Q8_0 / Q5_0: test_gemv_rows.py) quantize xn to one int8 code per column with a scale per
128-column group: within max |xn over its group| / 254 of xn (int8_x_bound with rows=True).
Outputs are poisoned with NaN bytes first (except where y aliases the residual).
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from flashd.daemon.backends.cuda.ops import gemv_rows_call
from flashd.scripts.random_weights import FLOAT_FORMATS, FORMATS, cols_of, random_weights

FD_E_ARG, FD_E_QTYPE, FD_E_SHAPE = -1, -2, -3
EPS = 1e-6
REL_TOL = 1e-5


def weights64(data, qtype, rows, cols):
    return dequantize(data, qtype).reshape(rows, cols).astype(np.float64)


def normed64(x, norm_w):
    x64 = x.astype(np.float64)
    if norm_w is None:
        return x64
    return x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + EPS) * norm_w.astype(np.float64)


XQ_DEN = 127 * 2 * 254
ROWS_XQ_DEN = 127 * 2          # gemv_rows.cuh: one code, rounded to nearest, step max / 127
ROWS_XG = 128                  # gemv_rows.cuh: columns of one x scale (gemv_rows_item.cuh ROWS_XG)
ROWS_QTYPES = (T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_0)   # the formats gemv_rows.cuh runs (ops.GEMV_ROWS_FORMAT_BITS)


def rows_path(native, qtypes, cols) -> bool:
    """Whether the library runs this call on gemv_rows.cuh (gemv_rows_plan.cuh rows_eligible)."""
    return gemv_rows_call(native.tuning(), qtypes, cols)


def x_block(qtypes) -> int:
    """Columns of one x scale on gemv_rows.cuh (gemv_rows_plan.cuh rows_fine): 32 in a launch of one 32-column format
    (Q8_0 or Q5_0), else a 128-column group (ROWS_XG)."""
    qs = {int(q) for q in qtypes}
    return 32 if len(qs) == 1 and qs <= {int(T.Q8_0), int(T.Q5_0)} else ROWS_XG


def rows_bound(native, qtypes, cols):
    """int8_x_bound's `rows` for this call: its x block on gemv_rows.cuh, False on gemv.cuh's kernels."""
    return x_block(qtypes) if rows_path(native, qtypes, cols) else False


def int8_x_bound(xn, W, rows=False):
    """The int8-activation path's extra error bound: |W| @ (per column, max |xn| over its x block) / XQ_DEN, the
    block 32 columns on gemv.cuh; on gemv_rows.cuh (rows = True: a 128-column group, ROWS_XG, a row's last may be
    32-96 wide; rows = an int: that many columns, x_block) with ROWS_XQ_DEN; 2% slack for the float32 scale and the
    float32 norm. 0 when cols % 32 != 0 (float path only)."""
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


def assert_close(got, want, scale, extra=0.0, what="", bound=0.0):
    err = np.abs(got.astype(np.float64) - want)
    tol = REL_TOL * scale + 1e-6 * extra + bound + 1e-30
    bad = ~(err <= tol)   # NaN fails
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} off; worst err {np.nanmax(err)} "
                           f"at tol {tol.reshape(-1)[np.argmax(bad.reshape(-1))]}; got {got[bad][:4]} want {want[bad][:4]}")


def call_gemv(native, dev, y, w, qtype, rows, cols, x, n_x, norm, bias, res):
    native.check(native.lib.fd_gemv(dev.p(y, "float*"), dev.p(w), int(qtype), rows, cols, dev.p(x, "float*"), n_x,
                                    dev.p(norm, "float*"), EPS, dev.p(bias, "float*"), dev.p(res, "float*"),
                                    dev.stream), "fd_gemv")
    dev.synchronize()


def call_swiglu(native, dev, y, w_gate, q_gate, w_up, q_up, rows, cols, x, n_x, norm):
    native.check(native.lib.fd_gemv_swiglu(dev.p(y, "float*"), dev.p(w_gate), int(q_gate), dev.p(w_up), int(q_up), rows,
                                           cols, dev.p(x, "float*"), n_x, dev.p(norm, "float*"), EPS, dev.stream),
                 "fd_gemv_swiglu")
    dev.synchronize()


def float_cols(n_blocks):
    return {1: 1, 3: 3, 7: 7}[n_blocks]


@pytest.mark.parametrize("n_x", [1, 3, 8])
@pytest.mark.parametrize("n_blocks", [1, 3, 7])
@pytest.mark.parametrize("rows", [1, 7, 129, 1000])
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_gemv_every_format_and_epilogue(native, dev, rng, poisoned, qtype, rows, n_blocks, n_x):
    cols = cols_of(qtype, n_blocks) if qtype not in FLOAT_FORMATS else float_cols(n_blocks)
    data = random_weights(rng, qtype, rows, cols)
    w = dev.upload(data)
    W = weights64(data, qtype, rows, cols)
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    d_x = dev.upload(x)
    norm_w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    d_norm = dev.upload(norm_w)
    bias = rng.standard_normal(rows).astype(np.float32)
    d_bias = dev.upload(bias)
    residual = rng.standard_normal((n_x, rows)).astype(np.float32)
    for use_norm in (False, True):
        xn = normed64(x, norm_w if use_norm else None)
        dot = xn @ W.T
        scale = np.abs(xn) @ np.abs(W).T
        xb = int8_x_bound(xn, W, rows_bound(native, [qtype], cols))
        # plain
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, d_x, n_x, d_norm if use_norm else None, None, None)
        assert_close(dev.download(y), dot, scale, what=f"plain norm={use_norm}", bound=xb)
        # bias
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, d_x, n_x, d_norm if use_norm else None, d_bias, None)
        assert_close(dev.download(y), dot + bias, scale, np.abs(bias), what=f"bias norm={use_norm}", bound=xb)
        # residual in a separate buffer
        d_res = dev.upload(residual)
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, d_x, n_x, d_norm if use_norm else None, None, d_res)
        assert_close(dev.download(y), dot + residual, scale, np.abs(residual), what=f"residual norm={use_norm}",
                     bound=xb)
        np.testing.assert_array_equal(dev.download(d_res), residual)   # residual untouched
        # y aliases the residual (the decoder's x += W h), with bias
        d_yr = dev.upload(residual)
        call_gemv(native, dev, d_yr, w, qtype, rows, cols, d_x, n_x, d_norm if use_norm else None, d_bias, d_yr)
        assert_close(dev.download(d_yr), dot + bias + residual, scale, np.abs(bias) + np.abs(residual),
                     what=f"aliased norm={use_norm}", bound=xb)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0, T.F16], ids=lambda q: q.name)
@pytest.mark.parametrize("rows,cols", [(8960, 1536), (1536, 8960), (256, 1536)])
def test_gemv_real_shapes(native, dev, rng, poisoned, qtype, rows, cols):
    """Qwen2.5-1.5B's projections: many steps per warp (8960 rows), wide rows (8960 cols)."""
    data = random_weights(rng, qtype, rows, cols)
    w = dev.upload(data)
    W = weights64(data, qtype, rows, cols)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    y = poisoned((1, rows))
    call_gemv(native, dev, y, w, qtype, rows, cols, dev.upload(x), 1, dev.upload(norm_w), None, None)
    xn = normed64(x, norm_w)
    assert_close(dev.download(y), xn @ W.T, np.abs(xn) @ np.abs(W).T, what=f"{qtype.name} {rows}x{cols}",
                 bound=int8_x_bound(xn, W, rows_bound(native, [qtype], cols)))


@pytest.mark.slow
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q8_0, T.F16], ids=lambda q: q.name)
def test_gemv_eight_rows_of_wide_input_take_several_passes(native, dev, rng, poisoned, qtype):
    """n_x = 8 x cols 8960 floats do not fit shared memory at once: the launcher splits the x rows."""
    rows, cols, n_x = 300, 8960, 8
    data = random_weights(rng, qtype, rows, cols)
    w = dev.upload(data)
    W = weights64(data, qtype, rows, cols)
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    residual = rng.standard_normal((n_x, rows)).astype(np.float32)
    d_yr = dev.upload(residual)
    call_gemv(native, dev, d_yr, w, qtype, rows, cols, dev.upload(x), n_x, dev.upload(norm_w), None, d_yr)
    xn = normed64(x, norm_w)
    assert_close(dev.download(d_yr), xn @ W.T + residual, np.abs(xn) @ np.abs(W).T, np.abs(residual),
                 bound=int8_x_bound(xn, W, rows_bound(native, [qtype], cols)))


@pytest.mark.slow
def test_gemv_lm_head_sized(native, dev, rng, poisoned):
    rows, cols = 40000, 1536   # a quarter of Qwen's vocabulary: persistent warps, ~10 steps each
    data = random_weights(rng, T.Q6_K, rows, cols)
    w = dev.upload(data)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    y = poisoned((2, rows))
    call_gemv(native, dev, y, w, T.Q6_K, rows, cols, dev.upload(x), 2, None, None, None)
    W = weights64(data, T.Q6_K, rows, cols)
    x64 = x.astype(np.float64)
    assert_close(dev.download(y), x64 @ W.T, np.abs(x64) @ np.abs(W).T,
                 bound=int8_x_bound(x64, W, rows_bound(native, [T.Q6_K], cols)))


def run_multi(native, dev, ys, ws, qtypes, rows, biases, cols, d_x, n_x, d_norm):
    ffi = native.ffi
    n = len(ws)
    c_y = ffi.new("float*[]", [dev.p(t, "float*") for t in ys])
    c_w = ffi.new("void*[]", [dev.p(t) for t in ws])
    c_q = ffi.new("int[]", [int(q) for q in qtypes])
    c_r = ffi.new("int[]", rows)
    c_b = ffi.new("float*[]", [dev.p(b, "float*") for b in biases])
    native.check(native.lib.fd_gemv_multi(n, c_y, c_w, c_q, c_r, c_b, cols, dev.p(d_x, "float*"), n_x,
                                          dev.p(d_norm, "float*"), EPS, dev.stream), "fd_gemv_multi")
    dev.synchronize()


@pytest.mark.parametrize("n_x", [1, 3, 8])
@pytest.mark.parametrize("case", [
    # (cols, [(qtype, rows, with_bias)]): Qwen 1.5B q/k/v (Q4_K + Q6_K v), 0.5B (Q5_0 + Q8_0 v),
    # every layout at once, and float weights with tails
    (1536, [(T.Q4_K, 1536, True), (T.Q4_K, 256, True), (T.Q6_K, 256, True)]),
    (896, [(T.Q5_0, 896, True), (T.Q5_0, 128, True), (T.Q8_0, 128, False)]),
    (512, [(T.Q4_K, 129, False), (T.Q8_0, 7, True), (T.Q4_0, 1, True), (T.F16, 1000, False)]),
    (37, [(T.F32, 5, True), (T.BF16, 130, False)]),
], ids=["qwen1.5b-qkv", "qwen0.5b-qkv", "mixed-layouts", "floats"])
def test_gemv_multi_mixed_formats(native, dev, rng, poisoned, case, n_x):
    cols, mats = case
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    d_x, d_norm = dev.upload(x), dev.upload(norm_w)
    for use_norm in (False, True):
        xn = normed64(x, norm_w if use_norm else None)
        ws, ys, biases, Ws, bs = [], [], [], [], []
        for qtype, rows, with_bias in mats:
            data = random_weights(rng, qtype, rows, cols)
            ws.append(dev.upload(data))
            Ws.append(weights64(data, qtype, rows, cols))
            ys.append(poisoned((n_x, rows)))
            b = rng.standard_normal(rows).astype(np.float32) if with_bias else None
            bs.append(b)
            biases.append(dev.upload(b) if with_bias else None)
        run_multi(native, dev, ys, ws, [m[0] for m in mats], [m[1] for m in mats], biases, cols, d_x, n_x,
                  d_norm if use_norm else None)
        for k, (y, W, b) in enumerate(zip(ys, Ws, bs)):
            want = xn @ W.T + (b if b is not None else 0)
            assert_close(dev.download(y), want, np.abs(xn) @ np.abs(W).T, np.abs(b) if b is not None else 0,
                         what=f"matrix {k} ({mats[k][0].name}) norm={use_norm}",
                         bound=int8_x_bound(xn, W, rows_bound(native, [m[0] for m in mats], cols)))


@pytest.mark.parametrize("n_x", [1, 3, 8])
@pytest.mark.parametrize("qtypes,rows,cols", [
    ((T.Q4_K, T.Q4_K), 8960, 1536),
    ((T.Q5_0, T.Q5_0), 4864, 896),
    ((T.Q4_K, T.Q6_K), 129, 512),
    ((T.Q8_0, T.F16), 1, 64),
    ((T.Q4_1, T.Q4_1), 1000, 576),
], ids=["q4k-1.5b", "q5_0-0.5b", "mixed-k", "mixed-q8-f16", "q4_1-smollm"])
def test_gemv_swiglu(native, dev, rng, poisoned, qtypes, rows, cols, n_x):
    qg, qu = qtypes
    dg, du = random_weights(rng, qg, rows, cols), random_weights(rng, qu, rows, cols)
    Wg, Wu = weights64(dg, qg, rows, cols), weights64(du, qu, rows, cols)
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    d_wg, d_wu, d_x, d_norm = dev.upload(dg), dev.upload(du), dev.upload(x), dev.upload(norm_w)
    for use_norm in (False, True):
        y = poisoned((n_x, rows))
        call_swiglu(native, dev, y, d_wg, qg, d_wu, qu, rows, cols, d_x, n_x, d_norm if use_norm else None)
        xn = normed64(x, norm_w if use_norm else None)
        g, u = xn @ Wg.T, xn @ Wu.T
        sig = 1 / (1 + np.exp(-g))
        want = g * sig * u
        # error propagation: |d silu(g)/dg| <= 1.1, so dy <= 1.1 |u| dg + |silu(g)| du
        scale = 1.1 * np.abs(u) * (np.abs(xn) @ np.abs(Wg).T) + np.abs(g * sig) * (np.abs(xn) @ np.abs(Wu).T)
        rp = rows_bound(native, qtypes, cols)
        xb = 1.1 * np.abs(u) * int8_x_bound(xn, Wg, rp) + np.abs(g * sig) * int8_x_bound(xn, Wu, rp)
        assert_close(dev.download(y), want, scale, what=f"swiglu norm={use_norm}", bound=xb)


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def call_kind(native, dev, poisoned, kind, d_a, qa, d_b, qb, rows, cols, d_x, n_x, d_norm, bias):
    """One launch of `kind` over matrices a (and b): "gemv" (a, with bias), "multi" (a with bias, b without) or
    "swiglu" (gate a, up b); the outputs (two for multi, else one), downloaded."""
    outs = [poisoned((n_x, rows)), poisoned((n_x, rows))]
    if kind == "gemv":
        call_gemv(native, dev, outs[0], d_a, qa, rows, cols, d_x, n_x, d_norm, bias, None)
    elif kind == "multi":
        run_multi(native, dev, outs, [d_a, d_b], [qa, qb], [rows, rows], [bias, None], cols, d_x, n_x, d_norm)
    else:
        call_swiglu(native, dev, outs[0], d_a, qa, d_b, qb, rows, cols, d_x, n_x, d_norm)
    return [dev.download(o) for o in (outs if kind == "multi" else outs[:1])]


def assert_graph_replays_eager(native, dev, poisoned, w, qtype, rows, cols, xs):
    """One-row fd_gemv (no norm, bias or residual) captured in a CUDA graph replays to the eager launch's bits for
    each x of xs (uploaded into the captured input between replays), under the tuning in effect."""
    lib, ffi = native.lib, native.ffi
    eager = []
    for x in xs:
        y = poisoned((1, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, dev.upload(x), 1, None, None, None)
        eager.append(bits(dev.download(y)))
    d_x = dev.upload(xs[0])
    y = poisoned((1, rows))
    native.check(lib.fd_graph_begin_capture(dev.stream), "begin capture")
    st = lib.fd_gemv(dev.p(y, "float*"), dev.p(w), int(qtype), rows, cols, dev.p(d_x, "float*"), 1, ffi.NULL, EPS,
                     ffi.NULL, ffi.NULL, dev.stream)
    graph = ffi.new("void**")
    native.check(lib.fd_graph_end_capture(dev.stream, graph), "end capture")
    native.check(st, "fd_gemv in capture")
    try:
        for x, want in zip(xs, eager):
            dev.upload(x, out=d_x)
            native.check(lib.fd_graph_launch(graph[0], dev.stream), "graph launch")
            dev.synchronize()
            assert np.array_equal(bits(dev.download(y)), want)
    finally:
        lib.fd_graph_destroy(graph[0])


@pytest.mark.parametrize("kind", ["gemv", "multi", "swiglu"])
@pytest.mark.parametrize("qtypes,rows,cols", [
    ((T.Q4_K, T.Q6_K), 1536, 1536),      # the 1.5B model's attention shapes (int8 activations)
    ((T.Q6_K, T.Q4_K), 1536, 8960),      # ffn_down-wide: several passes for 8 rows
    ((T.Q5_0, T.Q8_0), 896, 896),
    ((T.F16, T.Q4_0), 300, 512),         # a mixed launch: float activations
], ids=["q4k-q6k", "wide", "q5_0-q8_0", "f16-mixed"])
def test_rows_come_out_the_same_whatever_the_batch(native, dev, rng, poisoned, kind, qtypes, rows, cols):
    """Row invariance, bit for bit: row i of an n_x-row launch equals a 1-row launch on x[i], for
    n_x = 2..8 and with the fused RMSNorm (speculative verification reproduces decoding exactly)."""
    qa, qb = qtypes
    da, db = random_weights(rng, qa, rows, cols), random_weights(rng, qb, rows, cols)
    d_a, d_b = dev.upload(da), dev.upload(db)
    bias = dev.upload(rng.standard_normal(rows).astype(np.float32))
    x = (rng.standard_normal((8, cols)) * rng.uniform(0.1, 10.0, (8, 1))).astype(np.float32)
    d_norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))

    def run(xs):
        d_x = dev.upload(np.ascontiguousarray(xs))
        return call_kind(native, dev, poisoned, kind, d_a, qa, d_b, qb, rows, cols, d_x, xs.shape[0], d_norm, bias)

    single = [run(x[i:i + 1]) for i in range(8)]
    for n_x in range(2, 9):
        batch = run(x[:n_x])
        for i in range(n_x):
            for k, (got, want) in enumerate(zip(batch, single[i])):
                assert np.array_equal(bits(got[i]), bits(want[0])), f"{kind} n_x={n_x} row {i} matrix {k}"


def test_gemv_inside_graph_capture(native, dev, rng, poisoned):
    """The decode step is replayed as a CUDA graph: the launch (and its first-use setup) must capture."""
    lib, ffi = native.lib, native.ffi
    rows, cols, n_x = 300, 1536, 5
    data = random_weights(rng, T.Q4_K, rows, cols)
    w, x = dev.upload(data), rng.standard_normal((n_x, cols)).astype(np.float32)
    d_x = dev.upload(x)
    y = poisoned((n_x, rows))
    native.check(lib.fd_graph_begin_capture(dev.stream), "begin capture")
    st = lib.fd_gemv(dev.p(y, "float*"), dev.p(w), int(T.Q4_K), rows, cols, dev.p(d_x, "float*"), n_x, ffi.NULL,
                     EPS, ffi.NULL, ffi.NULL, dev.stream)
    graph = ffi.new("void**")
    native.check(lib.fd_graph_end_capture(dev.stream, graph), "end capture")
    native.check(st, "fd_gemv in capture")
    native.check(lib.fd_graph_launch(graph[0], dev.stream), "graph launch")
    dev.synchronize()
    lib.fd_graph_destroy(graph[0])
    W = weights64(data, T.Q4_K, rows, cols)
    x64 = x.astype(np.float64)
    assert_close(dev.download(y), x64 @ W.T, np.abs(x64) @ np.abs(W).T,
                 bound=int8_x_bound(x64, W, rows_bound(native, [T.Q4_K], cols)))


def test_bad_arguments(native, dev, rng):
    lib, ffi = native.lib, native.ffi
    s = dev.stream
    w = dev.upload(random_weights(rng, T.Q4_K, 4, 512))
    x = dev.upload(np.ones((8, 512), np.float32))
    y = dev.empty((8, 4))
    Y, X, W = dev.p(y, "float*"), dev.p(x, "float*"), dev.p(w)
    N = ffi.NULL
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 4, 500, X, 1, N, EPS, N, N, s) == FD_E_SHAPE
    assert lib.fd_gemv(Y, W, int(T.Q2_K), 4, 512, X, 1, N, EPS, N, N, s) == FD_E_QTYPE
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 4, 512, X, 0, N, EPS, N, N, s) == FD_E_ARG
    # n_x: <= 8 on gemv.cuh's kernels, <= 32 on gemv_rows.cuh (test_gemv_rows.py tests its 9..32)
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 4, 512, X, 33, N, EPS, N, N, s) == FD_E_ARG
    assert lib.fd_gemv(Y, W, int(T.Q5_0), 4, 512, X, 9, N, EPS, N, N, s) == FD_E_ARG
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 0, 512, X, 1, N, EPS, N, N, s) == FD_E_ARG
    assert lib.fd_gemv(N, W, int(T.Q4_K), 4, 512, X, 1, N, EPS, N, N, s) == FD_E_ARG
    assert lib.fd_gemv(Y, ffi.cast("void*", w.ptr + 4), int(T.Q4_K), 1, 256, X, 1, N, EPS, N, N, s) == FD_E_ARG
    ys = ffi.new("float*[]", [Y] * 5)
    ws = ffi.new("void*[]", [W] * 5)
    qs = ffi.new("int[]", [int(T.Q4_K)] * 5)
    rs = ffi.new("int[]", [4] * 5)
    assert lib.fd_gemv_multi(5, ys, ws, qs, rs, N, 512, X, 1, N, EPS, s) == FD_E_ARG
    assert lib.fd_gemv_multi(0, ys, ws, qs, rs, N, 512, X, 1, N, EPS, s) == FD_E_ARG
    qs[1] = int(T.Q2_K)
    assert lib.fd_gemv_multi(2, ys, ws, qs, rs, N, 512, X, 1, N, EPS, s) == FD_E_QTYPE
    assert lib.fd_gemv_swiglu(Y, W, int(T.Q4_K), W, int(T.Q8_0), 4, 500, X, 1, N, EPS, s) == FD_E_SHAPE
