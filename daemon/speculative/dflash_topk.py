"""Per-depth top-K with log-probabilities: the DFlash drafter's candidates from its block logits.

    lp[d]  = log_softmax(logits[d] / temperature)            float64, as daemon.sampling.log_softmax
    ids[d] = the K ids of largest lp[d], best first; equal lp: the lower id first

`topk_logprobs_reference` is the definition (a full stable argsort per row: ~20 ms per 151936-entry
row on one core, which made a 15-deep draft cost ~300 ms of host time). `topk_logprobs` gives the
same ids and bitwise the same log-probs without sorting the vocabulary: the K-th largest chunk
maximum bounds the K-th largest value from below (K chunks hold a value >= it), so only the chunks
whose maximum reaches it can hold a top-K entry, and only those few are sorted.
The CUDA backend computes the same thing on the device (`device_topk`: fd_topk_logprobs through
backends/cuda/topk_ops.py) and copies only the K ids and log-probs per depth back.
"""
from __future__ import annotations

import numpy as np

from ..sampling import log_softmax

__all__ = ["topk_logprobs", "topk_logprobs_reference", "device_topk", "CHUNK"]

CHUNK = 64           # entries per chunk maximum (151936 = 64 x 2374: no padding for the Qwen2.5 vocab)


def topk_logprobs_reference(logits: np.ndarray, k: int, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """ids int32 (n, k'), lp float64 (n, k') with k' = min(k, vocab), from logits (n, vocab)."""
    x = np.asarray(logits).astype(np.float64)
    lp = np.stack([log_softmax(row / temperature) for row in x]) if len(x) else x
    k = min(k, x.shape[1])
    top = np.argsort(-lp, axis=1, kind="stable")[:, :k]
    return top.astype(np.int32), np.take_along_axis(lp, top, axis=1)


def _log_normalizers(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row maxima m (n, 1) and log(sum(exp(x - m))) (n, 1), each row as log_softmax computes it
    (numpy reduces a contiguous row with the same pairwise summation as a 1-D array)."""
    m = x.max(axis=1, keepdims=True)
    return m, np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def _row_topk(row: np.ndarray, chunk_max: np.ndarray, k: int) -> np.ndarray:
    """Indices of row's k best entries under (value desc, id asc); chunk_max: row's chunk maxima."""
    n_chunks = chunk_max.shape[0]
    kk = min(k, n_chunks)
    bound = np.partition(chunk_max, n_chunks - kk)[n_chunks - kk]     # k-th largest chunk maximum
    chunks = np.flatnonzero(chunk_max >= bound)
    cand = (chunks[:, None] * CHUNK + np.arange(CHUNK)).reshape(-1)
    cand = cand[cand < row.shape[0]]
    order = np.lexsort((cand, -row[cand]))                            # value desc, then id asc
    return cand[order[:k]]


def topk_logprobs(logits: np.ndarray, k: int, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """topk_logprobs_reference's result (same ids, bitwise the same log-probs), in O(vocab) per row."""
    x = np.asarray(logits).astype(np.float64) / temperature              # (n, vocab), as the reference
    n, vocab = x.shape
    k = min(k, vocab)
    if n == 0 or k >= vocab // 2 or np.isnan(x).any():
        return topk_logprobs_reference(logits, k, temperature)
    pad = -vocab % CHUNK
    padded = np.pad(x, ((0, 0), (0, pad)), constant_values=-np.inf) if pad else x
    chunk_max = padded.reshape(n, -1, CHUNK).max(axis=2)                  # (n, vocab / CHUNK)
    ids = np.stack([_row_topk(x[d], chunk_max[d], k) for d in range(n)])
    m, log_z = _log_normalizers(x)
    lp = np.take_along_axis(x, ids, axis=1) - m - log_z
    return ids.astype(np.int32), lp


def device_topk(ops, max_rows: int, max_k: int = 8, *, on_device: bool = False):
    """(logits tensor, n_rows, k, temperature) -> (ids, lp) computed on the device, for a backend whose
    ops have `topk_to_host` (CUDA); None for the others (the host path above, the oracle). on_device: ids and lp
    stay there (device views, valid until the next call) instead of coming back to host arrays."""
    if not hasattr(ops, "topk_to_host"):
        return None
    from ..backends.cuda.topk_ops import TopKBuffers
    buffers = TopKBuffers(ops.dev, max_rows, max_k)
    fetch = ops.topk_on_device if on_device else ops.topk_to_host

    def run(logits, n_rows: int, k: int, temperature: float):
        return fetch(logits, buffers, n_rows, k, temperature)
    return run
