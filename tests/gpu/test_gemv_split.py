"""Split rows (fd_tuning_t.gemv_split_cols; gemv.cu gemv_split_kernel, gemv.cuh compute_step_split): a one-matrix
int8 fd_gemv of at least that many columns gives each row a whole warp (lanes per row 32) and computes it on a pair of
warps, each over half of the row's blocks, the two sums added in slice order.

Oracles: float64 numpy on gguf-dequantized weights with test_gemv.py's tolerance (the int8-activation bound plus
1e-5 of sum |W||xn|: a split changes only the float32 summation order); row invariance bit for bit (row i of an
n_x-row launch equals a one-row launch on x[i], n_x = 2..8, several passes for 8 rows of 17,408 columns: the split
applies to every n_x alike); the pre-pass (copy or read in place) gives the split launch the same bits; launches the
split does not take (SwiGLU, several matrices, float activations, fewer columns than the threshold) keep their
bits."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from flashd.scripts.random_weights import random_weights

from tests.gpu.test_gemv import (assert_close, assert_graph_replays_eager, bits, call_gemv, call_swiglu, int8_x_bound,
                                 normed64, run_multi, weights64)


@pytest.fixture
def restore_tuning(native):
    before = native.tuning()
    yield before
    native.set_tuning(**before)


SHAPES = [(T.Q6_K, 1536, 8960), (T.Q4_K, 1536, 8960), (T.Q4_K, 320, 17408), (T.Q8_0, 129, 4096),
          (T.Q5_0, 77, 2080), (T.Q4_K, 33, 768)]   # 768: 3 super-blocks (slices of 2 and 1)
IDS = ["q6k-1.5b-down", "q4k-1.5b-down", "q4k-27b-down", "q8_0", "q5_0-65-blocks", "q4k-3-blocks"]


def inputs(rng, dev, qtype, rows, cols):
    data = random_weights(rng, qtype, rows, cols)
    x = (rng.standard_normal((8, cols)) * rng.uniform(0.1, 10.0, (8, 1))).astype(np.float32)
    norm = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    res = rng.standard_normal((8, rows)).astype(np.float32)
    return data, x, norm, bias, res, dict(w=dev.upload(data), x=dev.upload(x), norm=dev.upload(norm),
                                          bias=dev.upload(bias), res=dev.upload(res))


@pytest.mark.parametrize("qtype,rows,cols", SHAPES, ids=IDS)
def test_split_rows_against_float64(native, dev, rng, poisoned, restore_tuning, qtype, rows, cols):
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_split_cols=1)
    data, x, norm, bias, res, d = inputs(rng, dev, qtype, rows, cols)
    W = weights64(data, qtype, rows, cols)
    for n_x in (1, 3, 8):
        for use_norm in (False, True):
            xn = normed64(x[:n_x], norm if use_norm else None)
            y = poisoned((n_x, rows))
            call_gemv(native, dev, y, d["w"], qtype, rows, cols, d["x"], n_x, d["norm"] if use_norm else None,
                      d["bias"], d["res"])
            want = xn @ W.T + bias + res[:n_x]
            assert_close(dev.download(y), want, np.abs(xn) @ np.abs(W).T, np.abs(bias) + np.abs(res[:n_x]),
                         what=f"n_x={n_x} norm={use_norm}", bound=int8_x_bound(xn, W))


@pytest.mark.parametrize("qtype,rows,cols", SHAPES[:3], ids=IDS[:3])
def test_split_rows_come_out_the_same_whatever_the_batch(native, dev, rng, poisoned, restore_tuning, qtype, rows, cols):
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_split_cols=1)
    _, x, _, _, _, d = inputs(rng, dev, qtype, rows, cols)

    def run(xs):
        n_x = xs.shape[0]
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, d["w"], qtype, rows, cols, dev.upload(np.ascontiguousarray(xs)), n_x, d["norm"],
                  d["bias"], None)
        return bits(dev.download(y))
    single = [run(x[i:i + 1]) for i in range(8)]
    for n_x in range(2, 9):
        batch = run(x[:n_x])
        for i in range(n_x):
            assert np.array_equal(batch[i], single[i][0]), f"n_x={n_x} row {i}"


@pytest.mark.parametrize("qtype,rows,cols", SHAPES[:3], ids=IDS[:3])
def test_the_pre_pass_gives_split_rows_the_same_bits(native, dev, rng, poisoned, restore_tuning, qtype, rows, cols):
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_split_cols=1, gemv_xq_prepass_cols=0,
                      gemv_xq_prepass_norm_cols=0, gemv_xq_direct=0)
    _, _, _, _, _, d = inputs(rng, dev, qtype, rows, cols)

    def run(n_x, use_norm):
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, d["w"], qtype, rows, cols, d["x"], n_x, d["norm"] if use_norm else None, None,
                  None)
        return bits(dev.download(y))
    cases = [(n_x, use_norm) for n_x in (1, 2, 8) for use_norm in (False, True)]
    base = {c: run(*c) for c in cases}
    for direct in (0, 1):
        native.set_tuning(gemv_xq_prepass_cols=1, gemv_xq_prepass_norm_cols=1, gemv_xq_direct=direct)
        for c in cases:
            assert np.array_equal(base[c], run(*c)), f"direct={direct} n_x={c[0]} norm={c[1]}"


def test_launches_the_split_does_not_take_keep_their_bits(native, dev, rng, poisoned, restore_tuning):
    """SwiGLU, fd_gemv_multi, float activations and a matrix under the column threshold (256 < 512 columns: its rows
    keep sharing a warp): the same bits with gemv_split_cols on as off."""
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_split_cols=0)
    rows, cols = 640, 5120
    a = dev.upload(random_weights(rng, T.Q4_K, rows, cols))
    b = dev.upload(random_weights(rng, T.Q4_K, rows, cols))
    f = dev.upload(random_weights(rng, T.F16, 300, 512))
    small = dev.upload(random_weights(rng, T.Q4_0, 2000, 256))   # 144-byte rows: several rows a warp
    x = dev.upload(rng.standard_normal((3, cols)).astype(np.float32))

    def runs():
        out = []
        for n_x in (1, 3):
            y = poisoned((n_x, rows))
            call_swiglu(native, dev, y, a, T.Q4_K, b, T.Q4_K, rows, cols, x, n_x, None)
            out.append(bits(dev.download(y)))
            ys = [poisoned((n_x, rows)), poisoned((n_x, rows))]
            run_multi(native, dev, ys, [a, b], [T.Q4_K, T.Q4_K], [rows, rows], [None, None], cols, x, n_x, None)
            out += [bits(dev.download(v)) for v in ys]
            y = poisoned((n_x, 300))
            call_gemv(native, dev, y, f, T.F16, 300, 512, x, n_x, None, None, None)
            out.append(bits(dev.download(y)))
            y = poisoned((n_x, 2000))
            call_gemv(native, dev, y, small, T.Q4_0, 2000, 256, x, n_x, None, None, None)
            out.append(bits(dev.download(y)))
        return out
    base = runs()
    native.set_tuning(gemv_split_cols=512)
    for k, (want, got) in enumerate(zip(base, runs())):
        assert np.array_equal(want, got), f"launch {k}"


def test_split_rows_inside_graph_capture(native, dev, rng, poisoned, restore_tuning):
    native.set_tuning(gemv_rows=0, gemv_mma_rows=0, gemv_split_cols=1)
    rows, cols = 700, 8960
    w = dev.upload(random_weights(rng, T.Q6_K, rows, cols))
    xs = [rng.standard_normal((1, cols)).astype(np.float32) for _ in range(2)]
    assert_graph_replays_eager(native, dev, poisoned, w, T.Q6_K, rows, cols, xs)
