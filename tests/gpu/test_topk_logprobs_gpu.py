"""fd_topk_logprobs (CudaOps.topk_logprobs / topk_to_host) against its definition,
daemon/speculative/dflash_topk.topk_logprobs_reference (a full stable argsort of the float64
log_softmax per row).

The ids must be equal (dividing float32 logits by a positive double keeps their order, ties go to the
lower id on both sides). The log-probs are float64 on both sides but the kernel sums exp() in a
different order than numpy's pairwise sum and uses the device's exp/log: a few ulps of the sum,
so rtol 1e-13 (values are O(10); float64 ulp 2e-15). Outputs are poisoned first (NaN bytes), so an
element the kernel forgot to write fails. k <= 32 takes the two-kernel path (chunks, then a merge), k = 40
the single kernel (topk.cu).
"""
import numpy as np
import pytest

from flashd.daemon.speculative.dflash_topk import device_topk, topk_logprobs_reference


def awkward(rng, n: int, vocab: int) -> np.ndarray:
    x = (rng.standard_normal((n, vocab)) * 4).astype(np.float32)
    x[0, ::7] = x[0].max()                       # ties at the top
    if n > 1:
        x[1] = np.round(x[1])                    # few distinct values: ties everywhere
    if n > 2:
        x[2, : max(vocab - 3, 0)] = -np.inf      # fewer finite entries than k
    if n > 3:
        x[3, -1] = x[3].max() + 1                # the best id is the last one
    return x


@pytest.fixture(scope="module")
def ops(dev):
    """On the `dev` fixture's Device: `poisoned` fills on its stream, so the kernel runs after the fill."""
    from flashd.daemon.backends.cuda.ops import CudaOps

    return CudaOps(dev)


@pytest.mark.parametrize("n_rows,n_vocab", [(15, 151936), (5, 1000), (4, 4099), (4, 7)])
@pytest.mark.parametrize("k,temperature", [(1, 1.0), (8, 1.0), (8, 0.6), (16, 2.5), (40, 1.0)])
def test_kernel_matches_the_definition(ops, rng, poisoned, n_rows, n_vocab, k, temperature):
    k = min(k, n_vocab)
    host = awkward(rng, n_rows, n_vocab)
    logits = ops.dev.upload(host)
    ids, lp = poisoned((n_rows, k), np.int32), _f64(ops, poisoned((n_rows * k * 8,), np.uint8), (n_rows, k))
    ops.topk_logprobs(logits, ids, lp, k, temperature)
    got_ids, got_lp = ops.dev.download(ids), _download_f64(ops, lp)
    want_ids, want_lp = topk_logprobs_reference(host, k, temperature)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_lp, want_lp, rtol=1e-13, atol=1e-12)


def _f64(ops, raw, shape):
    """A float64 view of a uint8 device tensor (tensor.CTYPES has no float64 pointer type: Device's
    fill / download take the bytes)."""
    from flashd.daemon.backends.cuda.tensor import DeviceTensor

    return DeviceTensor(raw.ptr, shape, np.dtype(np.float64), raw.owner)


def _download_f64(ops, t) -> np.ndarray:
    from flashd.daemon.backends.cuda.tensor import DeviceTensor

    raw = DeviceTensor(t.ptr, (t.nbytes,), np.dtype(np.uint8), t.owner)
    return ops.dev.download(raw).view(np.float64).reshape(t.shape)


def test_drafter_path_reads_back_the_same_candidates(ops, rng):
    """device_topk (the DFlash drafter's CUDA path: packed buffers, one read-back) on rows of a larger
    logits tensor, for every depth count and K the decoder asks."""
    host = awkward(rng, 15, 151936)
    logits = ops.dev.upload(host)
    run = device_topk(ops, 15)
    for n_rows, k in [(15, 8), (15, 1), (3, 8), (15, 12), (1, 1)]:
        ids, lp = run(logits, n_rows, k, 1.0)
        want_ids, want_lp = topk_logprobs_reference(host[:n_rows], k, 1.0)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(lp, want_lp, rtol=1e-13, atol=1e-12)


def test_nan_is_never_picked(ops):
    row = np.array([[1.0, np.nan, 3.0, np.nan, 3.0, -1.0]], np.float32)
    ids, lp = device_topk(ops, 1)(ops.dev.upload(row), 1, 6, 1.0)
    np.testing.assert_array_equal(ids[0], [2, 4, 0, 5, -1, -1])
    assert np.isneginf(lp[0, 4:]).all() and np.isfinite(lp[0, :4]).all()


def test_bad_arguments_are_refused(ops):
    from flashd.daemon.backends.cuda.lib import CudaError

    logits = ops.dev.upload(np.zeros((2, 10), np.float32))
    ids, lp = ops.dev.empty((2, 11), np.int32), ops.dev.empty((2, 11), np.float64)   # empty() takes any dtype
    with pytest.raises(CudaError):
        ops.topk_logprobs(logits, ids, lp, 11, 1.0)         # k > vocab
    ids, lp = ops.dev.empty((2, 3), np.int32), ops.dev.empty((2, 3), np.float64)
    with pytest.raises(CudaError):
        ops.topk_logprobs(logits, ids, lp, 3, 0.0)          # temperature 0
