"""The DFlash drafter's device top-K path without a GPU: CudaOps.topk_to_host (topk_ops.py: the
preallocated packed buffer, its float64 / int32 views, the one read-back) over a stand-in library
whose fd_topk_logprobs emulates topk.cu's two paths in numpy, dispatched as the C entry does:
the single kernel (round 0 the row's best entry, a float64 normaliser from it, round j the best entry
strictly after round j-1's pick under (logit desc, id asc), NaN never picked) and the two kernels
(chunks of TK_CHUNK logits: each its maximum, sum of exp and own top-k by the same rounds; then a merge:
the row's maximum, the rescaled sum, the top-k among the chunks' candidates) -- checked against
dflash_topk.topk_logprobs_reference, the definition. tests/gpu/test_topk_logprobs_gpu.py runs the real
kernels against the same definition.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.cuda.ops import CudaOps
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.speculative.dflash_topk import device_topk, topk_logprobs_reference
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative


def emulate_topk(row: np.ndarray, k: int, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """topk.cu's rounds for one float32 row (a reduction's result does not depend on its order)."""
    ids = np.full(k, -1, np.int32)
    lp = np.full(k, -np.inf)
    prev_v, prev_i = np.float32(np.inf), -1
    m = log_z = 0.0
    idx = np.arange(row.shape[0])
    for r in range(k):
        after = (row < prev_v) | ((row == prev_v) & (idx > prev_i))
        if not after.any():
            break
        best = row[after].max()
        bi = int(idx[after & (row == best)].min())
        if r == 0:
            m = float(best) / temperature
            x = row[~np.isnan(row)].astype(np.float64) / temperature
            log_z = float(np.log(np.exp(x - m).sum()))
        ids[r], lp[r] = bi, float(best) / temperature - m - log_z
        prev_v, prev_i = best, bi
    return ids, lp


TK_CHUNK, TK_FAST_MAX_K, TK_SCRATCH_BYTES = 2048, 32, 4 << 20     # topk.cu's constants


def _rounds(v: np.ndarray, idx: np.ndarray, k: int) -> list[tuple[float, int]]:
    """topk.cu's rounds over entries (v, idx): each the best strictly after the last pick; NaN never after."""
    picks, prev_v, prev_i = [], np.float32(np.inf), -1
    for _ in range(k):
        after = (v < prev_v) | ((v == prev_v) & (idx > prev_i))
        if not after.any():
            break
        best = v[after].max()
        bi = int(idx[after & (v == best)].min())
        picks.append((best, bi))
        prev_v, prev_i = best, bi
    return picks


def emulate_topk_chunked(row: np.ndarray, k: int, temperature: float, chunk: int = TK_CHUNK):
    """topk_chunk_kernel + topk_merge_kernel for one float32 row."""
    records = []
    for c0 in range(0, row.shape[0], chunk):
        v, idx = row[c0:c0 + chunk], np.arange(c0, min(c0 + chunk, row.shape[0]))
        picks = _rounds(v, idx, k)
        mc, s = -np.inf, 0.0
        if picks:
            mc = float(picks[0][0]) / temperature
            x = v[~np.isnan(v)].astype(np.float64) / temperature
            with np.errstate(invalid="ignore"):                      # an all -inf chunk: NaN, left out below
                s = float(np.exp(x - mc).sum())
        records.append((mc, s, picks))
    m = max(r[0] for r in records)
    z = sum(s * np.exp(mc - m) for mc, s, _ in records if mc > -np.inf)
    log_z = np.log(z) if z > 0 else -np.inf
    cand = [p for r in records for p in r[2]]
    picks = _rounds(np.array([p[0] for p in cand], np.float32), np.array([p[1] for p in cand]), k) if cand else []
    ids = np.full(k, -1, np.int32)
    lp = np.full(k, -np.inf)
    for j, (v, i) in enumerate(picks):
        ids[j], lp[j] = i, float(v) / temperature - m - log_z
    return ids, lp


def fast_path(n_rows: int, n_vocab: int, k: int) -> bool:
    """fd_topk_logprobs' choice of the two kernels."""
    n_chunks = -(-n_vocab // TK_CHUNK)
    return k <= TK_FAST_MAX_K and n_rows <= 65535 and n_rows * n_chunks * (16 + 8 * k) <= TK_SCRATCH_BYTES


class TopKLib(HostMemoryLib):
    def __init__(self, ffi):
        super().__init__(ffi)
        self.calls = 0

    def _array(self, p, n: int, dtype) -> np.ndarray:
        return np.frombuffer(self.ffi.buffer(self.ffi.cast("char*", p), n * np.dtype(dtype).itemsize), dtype)

    def fd_topk_logprobs(self, ids, logprobs, logits, n_rows, n_vocab, k, temperature, stream):
        self.calls += 1
        x = self._array(logits, n_rows * n_vocab, np.float32).reshape(n_rows, n_vocab)
        out_ids = self._array(ids, n_rows * k, np.int32).reshape(n_rows, k)
        out_lp = self._array(logprobs, n_rows * k, np.float64).reshape(n_rows, k)
        emulate = emulate_topk_chunked if fast_path(n_rows, n_vocab, k) else emulate_topk
        for r in range(n_rows):
            out_ids[r], out_lp[r] = emulate(x[r], k, temperature)
        return 0


class TopKNative(HostNative):
    def __init__(self):
        super().__init__()
        self.lib = TopKLib(self.ffi)


def awkward(rng, n: int, vocab: int) -> np.ndarray:
    x = (rng.standard_normal((n, vocab)) * 3).astype(np.float32)
    x[0, ::5] = x[0].max()                  # ties at the top: the lower id first
    x[1] = np.round(x[1])                   # few distinct values
    x[2, : vocab - 3] = -np.inf             # fewer finite entries than k
    return x


@pytest.mark.parametrize("vocab", [257, 1000, 4096, 6145])
@pytest.mark.parametrize("k,temperature", [(1, 1.0), (8, 1.0), (8, 0.5), (13, 3.0), (40, 1.0)])
def test_device_path_gives_the_definitions_candidates(vocab, k, temperature):
    ops = CudaOps(Device(TopKNative()))
    logits_host = awkward(np.random.default_rng(vocab + k), 5, vocab)
    logits = ops.dev.upload(logits_host)
    run = device_topk(ops, max_rows=4, max_k=2)          # smaller than asked: the buffers grow
    for n_rows in (5, 3):
        ids, lp = run(logits, n_rows, k, temperature)
        ref_ids, ref_lp = topk_logprobs_reference(logits_host[:n_rows], k, temperature)
        assert ids.dtype == np.int32 and lp.dtype == np.float64
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_allclose(lp, ref_lp, rtol=1e-13, atol=1e-12)


def test_nan_is_never_picked_and_the_reference_backend_has_no_device_path():
    from flashd.daemon.backends.reference import ReferenceOps

    assert device_topk(ReferenceOps(), 15) is None
    ops = CudaOps(Device(TopKNative()))
    row = np.array([[1.0, np.nan, 3.0, np.nan, 3.0, -1.0]], np.float32)
    ids, lp = device_topk(ops, 1)(ops.dev.upload(row), 1, 6, 1.0)
    np.testing.assert_array_equal(ids[0], [2, 4, 0, 5, -1, -1])
    assert np.isneginf(lp[0, 4:]).all() and np.isfinite(lp[0, :4]).all()


@pytest.mark.parametrize("chunk", [1, 7, 64, 5000])
@pytest.mark.parametrize("k", [1, 8, 20])
def test_the_chunked_algorithm_at_any_chunk_size(chunk, k):
    """The two-kernel path's algorithm with chunks smaller than k, not dividing the row, and larger than it:
    the definition's ids, log-probs to float64 rounding (the sums' order differs)."""
    x = awkward(np.random.default_rng(chunk + k), 5, 3001)
    x[3, 60:200] = x[3].max()                                    # a run of ties across chunk borders
    x[4] = -np.inf
    x[4, 2999] = 0.5                                              # one finite entry, in the last chunk
    ref_ids, ref_lp = topk_logprobs_reference(x, k, 0.7)
    for r in range(x.shape[0]):
        ids, lp = emulate_topk_chunked(x[r], k, 0.7, chunk)
        np.testing.assert_array_equal(ids, ref_ids[r])
        np.testing.assert_allclose(lp, ref_lp[r], rtol=1e-13, atol=1e-12)
