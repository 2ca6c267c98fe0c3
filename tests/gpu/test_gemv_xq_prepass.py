"""The GEMV's x pre-pass (fd_tuning_t.gemv_xq_prepass_cols, gemv.cu gemv_xq_image_kernel): a launch that quantizes x
once into a per-stream image, which each CTA of the one-row kernels copies instead of normalizing and quantizing x
itself (fd_tuning_t.gemv_xq_prepass_norm_cols for launches with the fused RMSNorm). It must change where the
codes are computed, never what they are.

Oracle: the same launches with the pre-pass off (every CTA quantizes x: gemv_stage.cuh stage_xq), compared bit for bit,
on fd_gemv / fd_gemv_multi / fd_gemv_swiglu, with and without the fused RMSNorm, 1 to 8 x rows (8 rows of the widest
shape take several passes, each with its own pre-pass over one buffer), the column counts of the 1.5B and 27B models
(1536, 5120, 8960, 17408) and awkward ones (a 32-column-only layout at 96 and 800 columns), a threshold that takes some
launches and not others, and inside graph capture. Float-activation launches (a float matrix in the launch) never take
it: their bits are checked too."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from flashd.scripts.random_weights import random_weights

from tests.gpu.test_gemv import EPS, assert_graph_replays_eager, call_kind


@pytest.fixture
def restore_tuning(native):
    before = native.tuning()
    yield before
    native.set_tuning(**before)


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


SHAPES = [
    ((T.Q4_K, T.Q6_K), 1536, 1536),      # the 1.5B's attention
    ((T.Q6_K, T.Q4_K), 1536, 8960),      # the 1.5B's ffn_down
    ((T.Q4_K, T.Q4_K), 640, 5120),       # the 27B's gate/up and projections of x (fewer rows: test time)
    ((T.Q6_K, T.Q4_K), 320, 17408),      # the 27B's ffn_down: 8 rows run in several passes
    ((T.Q8_0, T.Q5_0), 77, 96),          # 32-column layout only, 3 blocks
    ((T.Q5_0, T.Q8_0), 129, 800),        # 25 blocks: groups past a warp's end
    ((T.F16, T.Q4_0), 300, 512),         # a float matrix: float activations, no pre-pass
]
IDS = ["1.5b-attn", "1.5b-down", "27b-5120", "27b-down", "pad32-96", "pad32-800", "float-mixed"]


def launcher(native, dev, rng, poisoned, kind, qtypes, rows, cols):
    qa, qb = qtypes
    if kind == "swiglu" and qa != qb and T.F16 in qtypes:
        pytest.skip("swiglu with a float matrix is covered by test_gemv.py")
    da, db = random_weights(rng, qa, rows, cols), random_weights(rng, qb, rows, cols)
    d_a, d_b = dev.upload(da), dev.upload(db)
    bias = dev.upload(rng.standard_normal(rows).astype(np.float32))
    x = (rng.standard_normal((8, cols)) * rng.uniform(0.1, 10.0, (8, 1))).astype(np.float32)
    d_x = dev.upload(x)
    norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))

    def run(n_x, use_norm):
        return [bits(o) for o in call_kind(native, dev, poisoned, kind, d_a, qa, d_b, qb, rows, cols, d_x, n_x,
                                           norm if use_norm else None, bias)]
    return run


@pytest.mark.parametrize("kind", ["gemv", "multi", "swiglu"])
@pytest.mark.parametrize("qtypes,rows,cols", SHAPES, ids=IDS)
def test_the_pre_pass_gives_the_same_bits(native, dev, rng, poisoned, restore_tuning, kind, qtypes, rows, cols):
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_xq_prepass_cols=0, gemv_xq_prepass_norm_cols=0)
    run = launcher(native, dev, rng, poisoned, kind, qtypes, rows, cols)
    cases = [(n_x, use_norm) for n_x in (1, 2, 3, 8) for use_norm in (False, True)]
    base = {c: run(*c) for c in cases}
    native.set_tuning(gemv_xq_prepass_cols=1, gemv_xq_prepass_norm_cols=1)
    for c in cases:
        for k, (want, got) in enumerate(zip(base[c], run(*c))):
            assert np.array_equal(want, got), \
                f"{kind} n_x={c[0]} norm={c[1]} matrix {k}: {np.count_nonzero(want != got)} differ"


def test_the_threshold_takes_wide_launches_only_and_the_buffer_is_shared(native, dev, rng, poisoned, restore_tuning):
    """Thresholds between launches: the narrow one quantizes in its CTAs, the wide one takes the pre-pass, and a
    launch with the fused norm follows the norm threshold, one without it the other; interleaved on one stream (one
    buffer), every result is the no-pre-pass bits."""
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_xq_prepass_cols=0, gemv_xq_prepass_norm_cols=0)
    narrow = launcher(native, dev, rng, poisoned, "gemv", (T.Q4_K, T.Q4_K), 512, 1536)
    wide = launcher(native, dev, rng, poisoned, "swiglu", (T.Q4_K, T.Q4_K), 256, 8960)
    runs = [(narrow, 1, True), (wide, 1, True), (narrow, 3, False), (wide, 8, False), (narrow, 2, True)]
    base = [f(n, norm) for f, n, norm in runs]
    for cols, norm_cols in [(4096, 0), (0, 1024), (1024, 4096), (4096, 1024)]:
        native.set_tuning(gemv_xq_prepass_cols=cols, gemv_xq_prepass_norm_cols=norm_cols)
        for i, ((f, n, norm), b) in enumerate(zip(runs, base)):
            assert np.array_equal(b[0], f(n, norm)[0]), f"launch {i} at thresholds {cols} / {norm_cols}"


def test_the_pre_pass_inside_graph_capture(native, dev, rng, poisoned, restore_tuning):
    """A captured GEMV with the pre-pass (its buffer allocated on first use, in relaxed capture mode when that use is
    inside a capture) replays to the eager launch's bits, twice, with new x between replays."""
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_xq_prepass_cols=1, gemv_xq_prepass_norm_cols=1)
    rows, cols = 700, 8960
    w = dev.upload(random_weights(rng, T.Q6_K, rows, cols))
    xs = [rng.standard_normal((1, cols)).astype(np.float32) for _ in range(2)]
    assert_graph_replays_eager(native, dev, poisoned, w, T.Q6_K, rows, cols, xs)


@pytest.mark.parametrize("qtypes,rows,cols", [((T.Q4_K, T.Q4_K), 2000, 1536), ((T.Q4_K, T.Q4_K), 640, 5120),
                                              ((T.Q5_0, T.Q5_0), 1000, 896), ((T.Q6_K, T.Q6_K), 300, 8960),
                                              ((T.Q8_0, T.Q8_0), 129, 96), ((T.Q4_K, T.Q6_K), 300, 1536)],
                         ids=["q4k-1.5b", "q4k-27b", "q5_0-0.5b", "q6k-wide", "q8_0-pad32", "mixed"])
def test_the_paired_swiglu_dot_gives_the_same_bits(native, dev, rng, poisoned, restore_tuning, qtypes, rows, cols):
    """fd_tuning_t.gemv_swiglu_pair: gate and up rows in one loop (gemv_dot.cuh row_dot_q8_pair) are the two loops'
    bits, with and without the norm, with and without the pre-pass, and a launch of mixed formats (not paired) and
    several x rows (not paired) are unchanged."""
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_swiglu_pair=0)
    run = launcher(native, dev, rng, poisoned, "swiglu", qtypes, rows, cols)
    cases = [(n_x, use_norm) for n_x in (1, 3) for use_norm in (False, True)]
    base = {c: run(*c) for c in cases}
    for prepass in (0, 1):
        native.set_tuning(gemv_swiglu_pair=1, gemv_xq_prepass_cols=prepass, gemv_xq_prepass_norm_cols=prepass)
        for c in cases:
            assert np.array_equal(base[c][0], run(*c)[0]), f"n_x={c[0]} norm={c[1]} prepass={prepass}"


@pytest.mark.parametrize("kind", ["gemv", "multi", "swiglu"])
@pytest.mark.parametrize("qtypes,rows,cols", SHAPES, ids=IDS)
def test_x_read_in_place_gives_the_same_bits(native, dev, rng, poisoned, restore_tuning, kind, qtypes, rows, cols):
    """fd_tuning_t.gemv_xq_direct: one-row launches with the pre-pass read x's image where the pre-pass wrote it
    (global memory) instead of copying it into shared memory; the bits are the copy's (and the no-pre-pass ones),
    paired SwiGLU or not. Launches of several x rows ignore it (still the copy)."""
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_xq_prepass_cols=1, gemv_xq_prepass_norm_cols=1,
                      gemv_xq_direct=0)
    run = launcher(native, dev, rng, poisoned, kind, qtypes, rows, cols)
    cases = [(n_x, use_norm) for n_x in (1, 3) for use_norm in (False, True)]
    for pair in (0, 1):
        native.set_tuning(gemv_swiglu_pair=pair, gemv_xq_direct=0)
        base = {c: run(*c) for c in cases}
        native.set_tuning(gemv_xq_direct=1)
        for c in cases:
            for k, (want, got) in enumerate(zip(base[c], run(*c))):
                assert np.array_equal(want, got), \
                    f"{kind} pair={pair} n_x={c[0]} norm={c[1]} matrix {k}: {np.count_nonzero(want != got)} differ"


def test_x_read_in_place_sees_each_launchs_own_image(native, dev, rng, poisoned, restore_tuning):
    """Back-to-back launches on one stream share the pre-pass buffer: each pre-pass overwrites the image the GEMV
    before it read (possibly still in an SM's L1 from that launch). Twelve launches over four different x, queued
    without a synchronisation, alternating two matrices, must each give the bits of the same launch run alone with
    the copy."""
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_xq_prepass_cols=1, gemv_xq_prepass_norm_cols=1,
                      gemv_xq_direct=0)
    lib, ffi = native.lib, native.ffi
    rows, cols = 1536, 8960
    ws = [dev.upload(random_weights(rng, q, rows, cols)) for q in (T.Q6_K, T.Q4_K)]
    qts = [T.Q6_K, T.Q4_K]
    xs = [dev.upload(rng.standard_normal((1, cols)).astype(np.float32)) for _ in range(4)]
    plan = [(i % 2, i % 4) for i in range(12)]

    def queue():
        ys = [poisoned((1, rows)) for _ in plan]
        for y, (wi, xi) in zip(ys, plan):
            native.check(lib.fd_gemv(dev.p(y, "float*"), dev.p(ws[wi]), int(qts[wi]), rows, cols,
                                     dev.p(xs[xi], "float*"), 1, ffi.NULL, EPS, ffi.NULL, ffi.NULL, dev.stream),
                         "fd_gemv")
        return [bits(dev.download(y)) for y in ys]
    want = queue()
    native.set_tuning(gemv_xq_direct=1)
    for rep in range(3):
        for i, (w, g) in enumerate(zip(want, queue())):
            assert np.array_equal(w, g), f"repetition {rep}, launch {i}: {np.count_nonzero(w != g)} differ"
