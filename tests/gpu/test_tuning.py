"""The launch tuning (flashd_tuning.h, tuning.cu): the device starts from its architecture's table entry, bad
values are refused without changing anything, rounds, PDL, the tensor-core passes and the weights' L2 evict-first
hint never change a result -- a GEMV's rows under
them are the default tuning's bits (the launch's shape is not its arithmetic) -- and under another step
buffer size, which may choose other lanes per row and so another summation order, rows are still the same
bits whatever the batch (row invariance, which exact speculative decoding needs).
Oracle: the same launches under the default tuning, compared bit for bit; one-row launches for the batch."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from flashd.scripts.random_weights import random_weights

from tests.gpu.test_gemv import call_gemv, call_swiglu

FD_E_ARG = -1


@pytest.fixture
def restore_tuning(native):
    before = native.tuning()
    yield before
    native.set_tuning(**before)


def test_the_device_starts_from_its_architectures_entry(native, dev, restore_tuning):
    major, minor = (int(v) for v in dev.info()["cc"].split("."))
    entry = native.ffi.new("fd_tuning_t*")
    native.check(native.lib.fd_tuning_default(major, minor, entry), "fd_tuning_default")
    want = {name: int(getattr(entry, name)) for name, _ in native.ffi.typeof("fd_tuning_t").fields}
    assert restore_tuning == want
    if (major, minor) == (9, 0):
        assert want == {"gemv_int8_x": 1, "gemv_stage_bytes": 12288, "gemv_rounds": 0, "pdl": 1, "gemv_mma_rows": 0,
                        "gemv_rows": 1, "gemv_rows_fuse_nx": 1, "weights_evict_first": 1, "attn_single_chunks": 4,
                        "delta_cluster": 1, "gemv_xq_prepass_cols": 8192, "gemv_xq_prepass_norm_cols": 4096,
                        "gemv_swiglu_stage_bytes": 0, "gemv_swiglu_pair": 1,
                        "gemv_xq_direct": 0, "gemv_split_cols": 8192, "gemv_rows_tma": 1, "gemv_rows_formats": 3,
                        "gemv_rows_dp4a": 1, "gemv_rows_tma_split": 8, "gemv_rows_stage_x": 20000,
                        "gemv_rows_tma_warps": 19, "attn_o_codes": 1, "attn_masked_rope": 16}


@pytest.mark.parametrize("bad", [{"gemv_int8_x": 2}, {"gemv_stage_bytes": 255}, {"gemv_stage_bytes": 65537},
                                 {"gemv_rounds": 1}, {"gemv_rounds": 17}, {"pdl": -1}, {"gemv_mma_rows": 1},
                                 {"gemv_mma_rows": 9}, {"gemv_rows": -1}, {"gemv_rows": 9},
                                 {"gemv_rows_fuse_nx": -1}, {"gemv_rows_fuse_nx": 9},
                                 {"weights_evict_first": -1}, {"weights_evict_first": 2},
                                 {"attn_single_chunks": -1}, {"attn_single_chunks": 65},
                                 {"delta_cluster": -1}, {"delta_cluster": 2},
                                 {"gemv_xq_prepass_cols": -1}, {"gemv_xq_prepass_cols": (1 << 20) + 1},
                                 {"gemv_xq_prepass_norm_cols": -1}, {"gemv_xq_prepass_norm_cols": (1 << 20) + 1},
                                 {"gemv_swiglu_stage_bytes": -1}, {"gemv_swiglu_stage_bytes": 255},
                                 {"gemv_swiglu_stage_bytes": 65537}, {"gemv_swiglu_pair": -1},
                                 {"gemv_swiglu_pair": 2}, {"gemv_xq_direct": -1}, {"gemv_xq_direct": 2},
                                 {"gemv_split_cols": -1}, {"gemv_split_cols": (1 << 20) + 1},
                                 {"gemv_rows_tma": -1}, {"gemv_rows_tma": 9}, {"gemv_rows_formats": -1},
                                 {"gemv_rows_formats": 16}, {"gemv_rows_dp4a": -1}, {"gemv_rows_dp4a": 2},
                                 {"gemv_rows_tma_split": -1}, {"gemv_rows_tma_split": 65}, {"gemv_rows_stage_x": -1},
                                 {"gemv_rows_stage_x": (1 << 20) + 1}, {"gemv_rows_tma_warps": 3},
                                 {"gemv_rows_tma_warps": 32}, {"attn_o_codes": -1}, {"attn_o_codes": 2},
                                 {"attn_masked_rope": -1}, {"attn_masked_rope": 49}])
def test_out_of_range_values_are_refused_and_change_nothing(native, restore_tuning, bad):
    t = native.ffi.new("fd_tuning_t*", {**restore_tuning, **bad})
    assert native.lib.fd_tuning_set(t) == FD_E_ARG
    assert native.tuning() == restore_tuning
    with pytest.raises(KeyError):
        native.set_tuning(no_such_field=1)


SHAPES = [(T.Q4_K, 8960, 1536), (T.Q6_K, 1536, 8960), (T.Q5_0, 896, 896)]


def gemv_runner(native, dev, rng, poisoned, qtype, rows, cols):
    w = dev.upload(random_weights(rng, qtype, rows, cols))
    x = dev.upload(rng.standard_normal((3, cols)).astype(np.float32))
    norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))

    def run(n_x):
        y = poisoned((n_x, rows))
        call_gemv(native, dev, y, w, qtype, rows, cols, x, n_x, norm, None, None)
        return dev.download(y).view(np.uint32)
    return run


@pytest.mark.parametrize("change", [{"gemv_rounds": 2}, {"gemv_rounds": 4}, {"pdl": 0}, {"gemv_mma_rows": 2},
                                    {"gemv_mma_rows": 4}, {"weights_evict_first": 0},
                                    {"gemv_xq_prepass_cols": 1}, {"gemv_xq_prepass_norm_cols": 1},
                                    {"gemv_xq_prepass_cols": 0, "gemv_xq_prepass_norm_cols": 0},
                                    {"gemv_swiglu_stage_bytes": 2048}])   # (not a SwiGLU launch: no effect)
@pytest.mark.parametrize("qtype,rows,cols", SHAPES)
def test_rounds_and_pdl_never_change_a_result(native, dev, rng, poisoned, restore_tuning, change, qtype, rows, cols):
    run = gemv_runner(native, dev, rng, poisoned, qtype, rows, cols)
    base = [run(1), run(3)]
    native.set_tuning(**change)
    tuned = [run(1), run(3)]
    for b, t in zip(base, tuned):
        assert np.array_equal(b, t), f"{change}: {np.count_nonzero(b != t)} of {b.size} outputs differ"


@pytest.mark.parametrize("qtype,rows,cols", SHAPES[:2])
def test_the_evict_first_hint_never_changes_a_gemv_rows_result(native, dev, rng, poisoned, restore_tuning, qtype, rows,
                                                               cols):
    """weights_evict_first on the all-rows tensor-core path (gemv_rows.cuh's own staging): the same bits."""
    native.set_tuning(gemv_rows=1, gemv_rows_formats=15, weights_evict_first=0)
    run = gemv_runner(native, dev, rng, poisoned, qtype, rows, cols)
    base = [run(1), run(3)]
    native.set_tuning(weights_evict_first=1)
    for b, t in zip(base, [run(1), run(3)]):
        assert np.array_equal(b, t), f"{np.count_nonzero(b != t)} of {b.size} outputs differ"


@pytest.mark.parametrize("stage_bytes", [2048, 6144])
@pytest.mark.parametrize("qtype,rows,cols", SHAPES)
def test_other_step_sizes_keep_rows_invariant(native, dev, rng, poisoned, restore_tuning, stage_bytes, qtype, rows,
                                              cols):
    run = gemv_runner(native, dev, rng, poisoned, qtype, rows, cols)
    native.set_tuning(gemv_stage_bytes=stage_bytes)
    one, batch = run(1), run(3)
    assert np.array_equal(one[0], batch[0]), f"row 0 of a 3-row launch differs from the 1-row launch ({stage_bytes} B)"


@pytest.mark.parametrize("stage_bytes", [2048, 6144, 24576])
def test_swiglu_step_sizes_keep_rows_invariant(native, dev, rng, poisoned, restore_tuning, stage_bytes):
    """gemv_swiglu_stage_bytes: fd_gemv_swiglu under another step size (which may choose other lanes per row) still
    gives row i of a 3-row launch the bits of the 1-row launch on x[i], and its result stays within the default's
    float32 rounding (the same products, summed in another order)."""
    rows, cols = 2000, 1536
    dg, du = random_weights(rng, T.Q4_K, rows, cols), random_weights(rng, T.Q4_K, rows, cols)
    d_g, d_u = dev.upload(dg), dev.upload(du)
    x = dev.upload(rng.standard_normal((3, cols)).astype(np.float32))
    norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))

    def run(n_x):
        y = poisoned((n_x, rows))
        call_swiglu(native, dev, y, d_g, T.Q4_K, d_u, T.Q4_K, rows, cols, x, n_x, norm)
        return dev.download(y)
    default = run(1)
    native.set_tuning(gemv_swiglu_stage_bytes=stage_bytes)
    one, batch = run(1), run(3)
    assert np.array_equal(one[0].view(np.uint32), batch[0].view(np.uint32)), f"row 0 differs at {stage_bytes} B"
    np.testing.assert_allclose(one, default, rtol=1e-4, atol=1e-4 * float(np.abs(default).max()))
