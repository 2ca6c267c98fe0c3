"""gemv_rows.cuh -- the int8 tensor-core GEMV that fd_gemv, fd_gemv_multi and fd_gemv_swiglu run for Q4_K, Q6_K, Q8_0
and Q5_0 weights at every n_x (1..32) where the tuning's gemv_rows is on (the sm_90 table entry; each test here turns it
on and restores the tuning after).

Oracle (test_gemv.py's): W = gguf.quants.dequantize in float64, xn = x (or rmsnorm(x) * norm_w) in float64,
y = xn @ W.T (+ bias) (+ residual), or silu(xn @ Wg.T) * (xn @ Wu.T). Tolerance: |y - oracle| <= 1e-5 * |xn| @ |W|.T
+ 1e-6 * (|bias| + |residual|) + |W| @ (per column, max |xn| over its 128-column group) / 254 * 1.02 -- the last
term is the pre-pass's one int8 code per column with one scale a group (rounded to nearest: half a step of max /
127), the first the float32 steps (one a group, chunks added in chunk order) and the float32 norm.

Row invariance, bit for bit: row i of an n_x-row call equals the one-row call on x[i] for every n_x = 1..32, for
every entry point and epilogue, also with chunks of 2 super-blocks (a row's last chunk shorter) -- the kernel and
its chunking depend on the format, cols and the tuning, never on n_x.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from flashd.scripts.random_weights import cols_of, random_weights

from tests.gpu.test_gemv import (EPS, FD_E_ARG, assert_close, bits, call_gemv, call_kind, call_swiglu, int8_x_bound,
                                 normed64, rows_path, run_multi, weights64, x_block)

ROWS_FORMATS = [T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_0]


@pytest.fixture(params=[1, 2], ids=["ks1", "ks2"])
def rows_on(request, native):
    """gemv_rows = 1 (the table's sm_90 value) or 2 (chunks of 2 super-blocks) for the test, on all four formats
    (gemv_rows_formats 15), the tuning restored after; skipped where the library refuses it (below sm_80)."""
    before = native.tuning()
    t = native.ffi.new("fd_tuning_t*", {**before, "gemv_rows": request.param, "gemv_rows_formats": 15})
    if native.lib.fd_tuning_set(t) != 0:
        pytest.skip("gemv_rows refused here (no int8 mma.sync: below sm_80)")
    yield request.param
    native.set_tuning(**before)


def blocks_for(qtype, n_units):
    """cols of n_units chunk units (256 columns; Q8_0 / Q5_0: n_units blocks of 32, so cols need not be a multiple of
    256)."""
    return cols_of(qtype, n_units)


@pytest.mark.parametrize("n_x", [1, 2, 7, 9, 17, 32])
@pytest.mark.parametrize("rows,n_units", [(1, 1), (15, 3), (17, 7), (129, 35), (300, 2), (1000, 6)])
@pytest.mark.parametrize("qtype", ROWS_FORMATS, ids=lambda q: q.name)
def test_every_epilogue_against_float64(native, dev, rng, poisoned, rows_on, qtype, rows, n_units, n_x):
    cols = blocks_for(qtype, n_units)
    assert rows_path(native, [qtype], cols)
    data = random_weights(rng, qtype, rows, cols)
    w = dev.upload(data)
    W = weights64(data, qtype, rows, cols)
    x = (rng.standard_normal((n_x, cols)) * rng.uniform(0.1, 10.0, (n_x, 1))).astype(np.float32)
    d_x = dev.upload(x)
    norm_w = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    d_norm = dev.upload(norm_w)
    bias = rng.standard_normal(rows).astype(np.float32)
    d_bias = dev.upload(bias)
    residual = rng.standard_normal((n_x, rows)).astype(np.float32)
    for use_norm in (False, True):
        xn = normed64(x, norm_w if use_norm else None)
        dot, scale = xn @ W.T, np.abs(xn) @ np.abs(W).T
        xb = int8_x_bound(xn, W, rows=x_block([qtype]))   # Q8_0 / Q5_0: a scale a 32-column block
        nw = d_norm if use_norm else None
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, d_x, n_x, nw, None, None)
        assert_close(dev.download(y), dot, scale, what=f"plain norm={use_norm}", bound=xb)
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, d_x, n_x, nw, d_bias, None)
        assert_close(dev.download(y), dot + bias, scale, np.abs(bias), what=f"bias norm={use_norm}", bound=xb)
        d_res = dev.upload(residual)
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, d_x, n_x, nw, None, d_res)
        assert_close(dev.download(y), dot + residual, scale, np.abs(residual), what=f"residual norm={use_norm}", bound=xb)
        np.testing.assert_array_equal(dev.download(d_res), residual)
        d_yr = dev.upload(residual)          # y aliases the residual, with bias
        call_gemv(native, dev, d_yr, w, qtype, rows, cols, d_x, n_x, nw, d_bias, d_yr)
        assert_close(dev.download(d_yr), dot + bias + residual, scale, np.abs(bias) + np.abs(residual),
                     what=f"aliased norm={use_norm}", bound=xb)


@pytest.mark.parametrize("n_x", [1, 8, 32])
@pytest.mark.parametrize("case", [
    # (cols, [(qtype, rows, with_bias)]): Qwen 1.5B q/k/v (Q4_K + Q6_K v), a Q8_0 model's, 4 matrices of odd rows
    (1536, [(T.Q4_K, 1536, True), (T.Q4_K, 256, True), (T.Q6_K, 256, True)]),
    (896, [(T.Q8_0, 896, True), (T.Q8_0, 128, True)]),
    (512, [(T.Q4_K, 129, False), (T.Q6_K, 7, True), (T.Q8_0, 33, True), (T.Q4_K, 1, True)]),
    (896, [(T.Q5_0, 896, True), (T.Q5_0, 128, True), (T.Q8_0, 128, True)]),     # Qwen 0.5B Q4_K_M q/k/v
], ids=["qwen1.5b-qkv", "q8_0-qk", "four-odd", "qwen0.5b-qkv"])
def test_multi_against_float64(native, dev, rng, poisoned, rows_on, case, n_x):
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
                         what=f"matrix {k} ({mats[k][0].name}) norm={use_norm}", bound=int8_x_bound(xn, W, rows=x_block([m[0] for m in mats])))


@pytest.mark.parametrize("n_x", [1, 5, 16, 32])
@pytest.mark.parametrize("qtypes,rows,cols", [
    ((T.Q4_K, T.Q4_K), 8960, 1536),      # the 1.5B model's gate / up
    ((T.Q4_K, T.Q6_K), 129, 512),
    ((T.Q8_0, T.Q8_0), 100, 96),         # Q8_0 cols not a multiple of 256
    ((T.Q5_0, T.Q5_0), 4864, 896),       # the 0.5B model's gate / up
], ids=["q4k-1.5b", "mixed-k", "q8_0-narrow", "q5_0-0.5b"])
def test_swiglu_against_float64(native, dev, rng, poisoned, rows_on, qtypes, rows, cols, n_x):
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
        scale = 1.1 * np.abs(u) * (np.abs(xn) @ np.abs(Wg).T) + np.abs(g * sig) * (np.abs(xn) @ np.abs(Wu).T)
        xb = (1.1 * np.abs(u) * int8_x_bound(xn, Wg, x_block(qtypes))
              + np.abs(g * sig) * int8_x_bound(xn, Wu, x_block(qtypes)))
        assert_close(dev.download(y), g * sig * u, scale, what=f"swiglu norm={use_norm}", bound=xb)


@pytest.mark.parametrize("kind", ["gemv", "multi", "swiglu"])
@pytest.mark.parametrize("qtypes,rows,cols", [
    ((T.Q4_K, T.Q6_K), 1536, 1536),      # attention shapes
    ((T.Q6_K, T.Q4_K), 1536, 8960),      # ffn_down-wide: 35 chunks a row
    ((T.Q8_0, T.Q8_0), 333, 800),        # Q8_0, cols not a multiple of 256 (a short last chunk), rows % 16 != 0
    ((T.Q5_0, T.Q8_0), 333, 800),        # Q5_0 (22-byte blocks: rows 2-byte aligned), the same awkward shape
], ids=["q4k-q6k", "wide", "q8_0-awkward", "q5_0-awkward"])
def test_rows_are_bitwise_the_one_row_call_for_every_n(native, dev, rng, poisoned, rows_on, kind, qtypes, rows, cols):
    """Row i of an n_x-row call == the one-row call on x[i], bit for bit, n_x = 1..32, with the norm, bias and (gemv)
    an aliased residual."""
    qa, qb = qtypes
    da, db = random_weights(rng, qa, rows, cols), random_weights(rng, qb, rows, cols)
    d_a, d_b = dev.upload(da), dev.upload(db)
    bias = dev.upload(rng.standard_normal(rows).astype(np.float32))
    x = (rng.standard_normal((32, cols)) * rng.uniform(0.1, 10.0, (32, 1))).astype(np.float32)
    res = rng.standard_normal((32, rows)).astype(np.float32)
    d_norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))

    def run(i0, n_x):
        d_x = dev.upload(np.ascontiguousarray(x[i0:i0 + n_x]))
        if kind == "gemv":
            y = dev.upload(np.ascontiguousarray(res[i0:i0 + n_x]))
            call_gemv(native, dev, y, d_a, qa, rows, cols, d_x, n_x, d_norm, bias, y)
            return [bits(dev.download(y))]
        outs = [poisoned((n_x, rows)), poisoned((n_x, rows))]
        if kind == "multi":
            run_multi(native, dev, outs, [d_a, d_b], [qa, qb], [rows, rows], [bias, None], cols, d_x, n_x, d_norm)
            return [bits(dev.download(o)) for o in outs]
        call_swiglu(native, dev, outs[0], d_a, qa, d_b, qb, rows, cols, d_x, n_x, d_norm)
        return [bits(dev.download(outs[0]))]

    single = [run(i, 1) for i in range(32)]
    for n_x in range(2, 33):
        batch = run(0, n_x)
        for i in range(n_x):
            for k, (got, want) in enumerate(zip(batch, single[i])):
                assert np.array_equal(got[i], want[0]), f"{kind} n_x={n_x} row {i} matrix {k}"


def test_first_call_inside_graph_capture(native, rng, poisoned, rows_on):
    """A stream's first call allocates its x scratch: inside a capture too (the decode step is a captured graph)."""
    from flashd.daemon.backends.cuda.tensor import Device

    dev = Device(native)                      # a new stream: no scratch yet
    lib, ffi = native.lib, native.ffi
    rows, cols, n_x = 300, 1536, 20
    data = random_weights(rng, T.Q4_K, rows, cols)
    w, x = dev.upload(data), rng.standard_normal((n_x, cols)).astype(np.float32)
    d_x = dev.upload(x)
    y = dev.empty((n_x, rows))
    dev.fill_bytes(y, 0xFF)
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
    assert_close(dev.download(y), x64 @ W.T, np.abs(x64) @ np.abs(W).T, bound=int8_x_bound(x64, W, rows=True))


def test_row_limits(native, dev, rng, rows_on):
    """n_x <= 32 on this path; formats it does not run (or whose gemv_rows_formats bit is off) keep n_x <= 8; with
    gemv_rows off Q4_K keeps n_x <= 8."""
    lib, ffi = native.lib, native.ffi
    w = dev.upload(random_weights(rng, T.Q4_K, 4, 512))
    x = dev.upload(np.ones((33, 512), np.float32))
    y = dev.empty((33, 4))
    Y, X, W, N, s = dev.p(y, "float*"), dev.p(x, "float*"), dev.p(w), ffi.NULL, dev.stream
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 4, 512, X, 32, N, EPS, N, N, s) == 0
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 4, 512, X, 33, N, EPS, N, N, s) == FD_E_ARG
    assert lib.fd_gemv(Y, W, int(T.Q4_0), 4, 512, X, 9, N, EPS, N, N, s) == FD_E_ARG
    native.set_tuning(gemv_rows_formats=15 & ~1)                 # Q4_K's bit off: Q4_K back on gemv.cuh ...
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 4, 512, X, 9, N, EPS, N, N, s) == FD_E_ARG
    w6 = dev.upload(random_weights(rng, T.Q6_K, 4, 512))           # ... the other formats stay
    assert lib.fd_gemv(Y, dev.p(w6), int(T.Q6_K), 4, 512, X, 32, N, EPS, N, N, s) == 0
    native.set_tuning(gemv_rows=0, gemv_rows_formats=15)
    assert lib.fd_gemv(Y, W, int(T.Q4_K), 4, 512, X, 9, N, EPS, N, N, s) == FD_E_ARG
    dev.synchronize()


@pytest.mark.parametrize("qtype,rows,cols", [(T.Q4_K, 8960, 1536), (T.Q6_K, 1536, 8960), (T.Q8_0, 896, 896),
                                             (T.Q5_0, 4864, 896)])
def test_pdl_never_changes_a_result(native, dev, rng, poisoned, rows_on, qtype, rows, cols):
    w = dev.upload(random_weights(rng, qtype, rows, cols))
    x = dev.upload(rng.standard_normal((17, cols)).astype(np.float32))
    norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))

    def run(n_x):
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, x, n_x, norm, None, None)
        return bits(dev.download(y))
    base = [run(1), run(17)]
    native.set_tuning(pdl=0)
    for b, t in zip(base, [run(1), run(17)]):
        assert np.array_equal(b, t)


@pytest.mark.parametrize("kind", ["gemv", "multi", "swiglu"])
@pytest.mark.parametrize("qtypes,rows,cols", [
    ((T.Q4_K, T.Q4_K), 8960, 1536),      # ffn_gate / up: 560 tiles on 132 SMs
    ((T.Q6_K, T.Q4_K), 4608, 8960),      # wide with > 2 tiles an SM: 35 KB of x a row in every CTA
    ((T.Q8_0, T.Q6_K), 333, 768),        # mixed formats (multi), rows % 16 != 0 (few tiles: the pre-pass both ways)
], ids=["gate", "wide", "mixed"])
def test_the_ctas_own_x_copy_is_the_pre_pass_bit_for_bit(native, dev, rng, poisoned, rows_on, kind, qtypes, rows,
                                                          cols):
    """gemv_rows_fuse_nx (n_x <= it: each CTA quantizes x itself, norm included; else the pre-pass launch) never
    changes a result: n_x = 1..8 and 9 under fuse_nx = 0 and 8, with and without the norm, bit for bit."""
    qa, qb = qtypes
    d_a, d_b = dev.upload(random_weights(rng, qa, rows, cols)), dev.upload(random_weights(rng, qb, rows, cols))
    x = dev.upload((rng.standard_normal((9, cols)) * rng.uniform(0.1, 10.0, (9, 1))).astype(np.float32))
    d_norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))

    def run(n_x, norm):
        return [bits(o) for o in call_kind(native, dev, poisoned, kind, d_a, qa, d_b, qb, rows, cols, x, n_x, norm,
                                           None)]

    cases = [(n_x, norm) for n_x in range(1, 10) for norm in (None, d_norm)]
    native.set_tuning(gemv_rows_fuse_nx=0)
    pre = [run(*c) for c in cases]
    native.set_tuning(gemv_rows_fuse_nx=8)
    for (n_x, norm), want in zip(cases, pre):
        for k, (got, w) in enumerate(zip(run(n_x, norm), want)):
            assert np.array_equal(got, w), f"{kind} n_x={n_x} norm={norm is not None} matrix {k}"


# Launch shapes that never change a bit (all on the bulk-copy kernel, sm_90): the reference has x's codes read from
# the pre-pass's scratch by int8 mma items, one bulk copy a tile; each variant moves x into the CTAs' shared memory
# (stage_x: the pre-pass's codes copied in where n_x x cols is at most that many bytes; fuse_nx: every CTA quantizes x
# itself), computes one-row Q4_K / Q6_K items on dp4a lanes and / or copies one-tile CTAs' tiles in pieces of
# tma_split chunks, on 4 .. 31 computing warps (tma_warps: the items' round-robin over the warps; above 19 only the
# one-row dp4a launches).
SHAPE_VARIANTS = {
    "stage+dp4a": {"gemv_rows_stage_x": 1 << 20, "gemv_rows_fuse_nx": 1, "gemv_rows_dp4a": 1},
    "stage+split3": {"gemv_rows_stage_x": 1 << 20, "gemv_rows_tma_split": 3},
    "fuse8+dp4a+split1": {"gemv_rows_fuse_nx": 8, "gemv_rows_dp4a": 1, "gemv_rows_tma_split": 1},
    "stage4k+split4": {"gemv_rows_stage_x": 4096, "gemv_rows_tma_split": 4},
    "dp4a+split8+warps19": {"gemv_rows_fuse_nx": 1, "gemv_rows_dp4a": 1, "gemv_rows_tma_split": 8,
                            "gemv_rows_tma_warps": 19},
    "stage+warps18": {"gemv_rows_stage_x": 1 << 20, "gemv_rows_tma_warps": 18},
    "warps5": {"gemv_rows_tma_warps": 5},
    "dp4a+warps24": {"gemv_rows_fuse_nx": 1, "gemv_rows_dp4a": 1, "gemv_rows_tma_warps": 24},
    "dp4a+split8+warps31": {"gemv_rows_fuse_nx": 1, "gemv_rows_dp4a": 1, "gemv_rows_tma_split": 8,
                            "gemv_rows_tma_warps": 31},
}
SHAPE_REFERENCE = {"gemv_rows_dp4a": 0, "gemv_rows_stage_x": 0, "gemv_rows_fuse_nx": 0, "gemv_rows_tma_split": 0,
                   "gemv_rows_tma_warps": 16}


@pytest.mark.parametrize("n_x", [1, 2, 5, 8])
@pytest.mark.parametrize("kind", ["gemv", "multi", "swiglu"])
@pytest.mark.parametrize("rows,cols", [
    (8960, 1536),     # ffn_gate / up: 560 tiles, 6 chunks a row
    (1536, 8960),     # ffn_down: 96 tiles (one a CTA), 35 chunks a row: the pieces
    (37, 768),        # rows % 16 != 0 (a short last tile), 3 super-blocks
    (16, 256),        # one tile, one super-block
], ids=["gate", "down", "awkward", "one-block"])
@pytest.mark.parametrize("qtypes", [(T.Q4_K, T.Q4_K), (T.Q6_K, T.Q6_K), (T.Q4_K, T.Q6_K), (T.Q8_0, T.Q8_0),
                                    (T.Q5_0, T.Q4_K)], ids=["Q4_K", "Q6_K", "Q4_K+Q6_K", "Q8_0", "Q5_0+Q4_K"])
def test_launch_shapes_are_bit_for_bit(native, dev, rng, poisoned, rows_on, kind, rows, cols, qtypes, n_x):
    """gemv_rows_dp4a (one-row items on dp4a lanes for Q4_K / Q6_K matrices: one format, or mixed as q / k / v with a
    Q6_K v -- the second matrix of multi and swiglu), gemv_rows_stage_x (2 .. 8 x rows: the pre-pass's codes copied
    into every CTA), gemv_rows_fuse_nx (every CTA quantizes x itself), gemv_rows_tma_split (one-tile CTAs copy their
    tile in pieces) and gemv_rows_tma_warps (the items on 5 .. 19 warps; one-row dp4a launches on 24 or 31, their own
    kernel): every output equals the reference shape's (int8 mma items reading x's codes from the pre-pass's
    scratch, whole-tile copies) bit for bit, with and without the norm, the bias and an aliased residual, at chunks of
    1 and 2 super-blocks (rows_on: ks1 / ks2)."""
    major = int(dev.info()["cc"].split(".")[0])
    if major < 9 or not native.tuning()["gemv_rows_tma"]:
        pytest.skip("no bulk-copy gemv_rows kernel here (sm_90 and later, gemv_rows_tma on)")
    qa, qb = qtypes   # (Q6_K rows of 768 columns take the cp.async kernel: the reference shape there)
    if kind == "swiglu" and qa != qb and T.Q5_0 in qtypes:
        qb = qa
    d_a, d_b = dev.upload(random_weights(rng, qa, rows, cols)), dev.upload(random_weights(rng, qb, rows, cols))
    x = (rng.standard_normal((n_x, cols)) * rng.uniform(0.5, 4.0, (n_x, 1))).astype(np.float32)
    res = rng.standard_normal((n_x, rows)).astype(np.float32)
    d_x = dev.upload(x)
    d_norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))
    bias = dev.upload(rng.standard_normal(rows).astype(np.float32))

    def run(norm):
        if kind == "gemv":
            y = dev.upload(res)
            call_gemv(native, dev, y, d_a, qa, rows, cols, d_x, n_x, norm, bias, y)
            return [bits(dev.download(y))]
        outs = [poisoned((n_x, rows)), poisoned((n_x, rows))]
        if kind == "multi":
            run_multi(native, dev, outs, [d_a, d_b], [qa, qb], [rows, rows], [bias, None], cols, d_x, n_x, norm)
            return [bits(dev.download(o)) for o in outs]
        call_swiglu(native, dev, outs[0], d_a, qa, d_b, qb, rows, cols, d_x, n_x, norm)
        return [bits(dev.download(outs[0]))]

    for norm in (None, d_norm):   # (rows_on restores the whole tuning after)
        native.set_tuning(**SHAPE_REFERENCE)
        want = run(norm)
        for name, variant in SHAPE_VARIANTS.items():
            native.set_tuning(**{**SHAPE_REFERENCE, **variant})
            got = run(norm)
            for k, (g, w) in enumerate(zip(got, want)):
                assert np.array_equal(g, w), f"{name}: {kind} norm={norm is not None} matrix {k}"
