"""The tensor-core GEMV passes (gemv_mma.cuh: launches of 2..8 x rows, int8 activations) against the one-row kernel,
bit for bit: every quantized format (parts of 16 and 32 columns), tiles cut by awkward row counts, rows of 1 to 35
blocks (groups with no block), every x-row count, bias and residual (y aliasing it), several matrices of mixed
formats in one launch, SwiGLU, a wide input that takes passes. Oracle: the same launch with the tensor-core path
off (gemv_mma_rows = 0) and the one-row launch of each x row; a float format in a launch keeps the whole launch
on the one-row kernel. Accuracy against float64 is test_gemv.py's (its multi-row cases run this path). With the
tuning's gemv_rows on, Q4_K / Q6_K / Q8_0 / Q5_0 calls run gemv_rows.cuh instead: these tests turn it off."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from flashd.scripts.random_weights import cols_of, random_weights

from tests.gpu.test_gemv import EPS, bits, call_gemv, run_multi

QUANT = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]


@pytest.fixture
def restore_tuning(native):
    """The tuning as it was, restored after the test; during it gemv_rows is off, so Q4_K / Q6_K / Q8_0 / Q5_0 calls run the
    kernels this file compares (gemv_rows.cuh is test_gemv_rows.py's)."""
    before = native.tuning()
    native.set_tuning(gemv_rows=0)
    yield before
    native.set_tuning(**before)


def both_paths(native, run):
    """run() with the tensor-core passes on (from 2 rows) and off: (on, off)."""
    native.set_tuning(gemv_mma_rows=2)
    on = run()
    native.set_tuning(gemv_mma_rows=0)
    off = run()
    native.set_tuning(gemv_mma_rows=2)
    return on, off


@pytest.mark.parametrize("qtype", QUANT, ids=lambda q: q.name)
@pytest.mark.parametrize("rows,n_blocks", [(1, 1), (15, 3), (17, 7), (129, 35), (300, 2)])
def test_every_format_equals_the_one_row_kernel(native, dev, rng, poisoned, restore_tuning, qtype, rows, n_blocks):
    cols = cols_of(qtype, n_blocks)
    w = dev.upload(random_weights(rng, qtype, rows, cols))
    x = (rng.standard_normal((8, cols)) * rng.uniform(0.1, 10.0, (8, 1))).astype(np.float32)
    d_x = dev.upload(x)
    norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))
    bias = dev.upload(rng.standard_normal(rows).astype(np.float32))
    res = rng.standard_normal((8, rows)).astype(np.float32)
    for n_x in (2, 3, 5, 8):
        def run():
            y = dev.upload(res[:n_x])   # y aliases the residual
            call_gemv(native, dev, y, w, qtype, rows, cols, d_x, n_x, norm, bias, y)
            return bits(dev.download(y))
        on, off = both_paths(native, run)
        assert np.array_equal(on, off), f"{qtype.name} {rows}x{cols} n_x={n_x}: {np.count_nonzero(on != off)} differ"
    native.set_tuning(gemv_mma_rows=0)
    single = []
    for i in range(8):
        y = dev.upload(res[i:i + 1])
        call_gemv(native, dev, y, w, qtype, rows, cols, dev.upload(x[i:i + 1]), 1, norm, bias, y)
        single.append(bits(dev.download(y))[0])
    native.set_tuning(gemv_mma_rows=2)
    y = dev.upload(res)
    call_gemv(native, dev, y, w, qtype, rows, cols, d_x, 8, norm, bias, y)
    got = bits(dev.download(y))
    for i in range(8):
        assert np.array_equal(got[i], single[i]), f"{qtype.name} row {i} of 8 differs from its one-row launch"


@pytest.mark.parametrize("mats,cols", [
    ([(T.Q4_K, 1536), (T.Q4_K, 256), (T.Q6_K, 256)], 1536),     # the 1.5B model's QKV
    ([(T.Q5_0, 896), (T.Q5_0, 128), (T.Q8_0, 128)], 896),       # the 0.5B model's
    ([(T.Q4_0, 33), (T.Q6_K, 7), (T.Q4_1, 100), (T.Q5_K, 48)], 512),
    ([(T.Q4_K, 64), (T.F16, 40)], 512),                          # a float matrix: the one-row kernel throughout
], ids=["qwen1.5b-qkv", "qwen0.5b-qkv", "four-formats", "with-float"])
def test_several_matrices_in_one_launch(native, dev, rng, poisoned, restore_tuning, mats, cols):
    ws = [dev.upload(random_weights(rng, q, r, cols)) for q, r in mats]
    biases = [dev.upload(rng.standard_normal(r).astype(np.float32)) if k % 2 == 0 else None
              for k, (_, r) in enumerate(mats)]
    x = dev.upload(rng.standard_normal((8, cols)).astype(np.float32))
    norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))
    for n_x in (2, 8):
        def run():
            ys = [poisoned((n_x, r)) for _, r in mats]
            run_multi(native, dev, ys, ws, [q for q, _ in mats], [r for _, r in mats], biases, cols, x, n_x, norm)
            return [bits(dev.download(y)) for y in ys]
        on, off = both_paths(native, run)
        for k, (a, b) in enumerate(zip(on, off)):
            assert np.array_equal(a, b), f"matrix {k} ({mats[k][0].name}) n_x={n_x}"


@pytest.mark.parametrize("qtypes,rows,cols", [((T.Q4_K, T.Q4_K), 8960, 1536), ((T.Q5_0, T.Q5_0), 4864, 896),
                                              ((T.Q6_K, T.Q4_K), 37, 768), ((T.Q8_0, T.Q4_1), 17, 96)],
                         ids=["q4k-1.5b", "q5_0-0.5b", "k-mixed", "q32-mixed"])
def test_swiglu(native, dev, rng, poisoned, restore_tuning, qtypes, rows, cols):
    qg, qu = qtypes
    wg, wu = dev.upload(random_weights(rng, qg, rows, cols)), dev.upload(random_weights(rng, qu, rows, cols))
    x = dev.upload(rng.standard_normal((8, cols)).astype(np.float32))
    norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))
    for n_x in (2, 4, 8):
        def run():
            y = poisoned((n_x, rows))
            native.check(native.lib.fd_gemv_swiglu(dev.p(y, "float*"), dev.p(wg), int(qg), dev.p(wu), int(qu), rows,
                                                   cols, dev.p(x, "float*"), n_x, dev.p(norm, "float*"), EPS,
                                                   dev.stream), "fd_gemv_swiglu")
            dev.synchronize()
            return bits(dev.download(y))
        on, off = both_paths(native, run)
        assert np.array_equal(on, off), f"swiglu n_x={n_x}: {np.count_nonzero(on != off)} differ"


def test_wide_input_in_passes_and_graph_capture(native, dev, rng, poisoned, restore_tuning):
    """ffn_down-wide (8960 columns: 8 x rows do not fit one pass) and a captured launch replayed twice."""
    rows, cols = 1536, 8960
    w = dev.upload(random_weights(rng, T.Q6_K, rows, cols))
    x = dev.upload(rng.standard_normal((8, cols)).astype(np.float32))
    y = poisoned((8, rows))

    def run():
        call_gemv(native, dev, y, w, T.Q6_K, rows, cols, x, 8, None, None, None)
        return bits(dev.download(y))
    on, off = both_paths(native, run)
    assert np.array_equal(on, off)
    lib = native.lib
    native.check(lib.fd_graph_begin_capture(dev.stream), "begin capture")
    native.check(lib.fd_gemv(dev.p(y, "float*"), dev.p(w), int(T.Q6_K), rows, cols, dev.p(x, "float*"), 8,
                             native.ffi.NULL, EPS, native.ffi.NULL, native.ffi.NULL, dev.stream), "fd_gemv")
    g = native.ffi.new("void**")
    native.check(lib.fd_graph_end_capture(dev.stream, g), "end capture")
    for _ in range(2):
        dev.fill_bytes(y, 0xFF)
        native.check(lib.fd_graph_launch(g[0], dev.stream), "graph launch")
        dev.synchronize()
        assert np.array_equal(bits(dev.download(y)), on)
    lib.fd_graph_destroy(g[0])
