"""TopKOps.topk_logprobs: fd_topk_logprobs, per-row top-K with log-probabilities on the device.

A mixin of CudaOps (same device, stream and status checks). The DFlash drafter's candidates: of the
drafter's (B-1, vocab) block logits only K ids and K log-probs per depth come back to the host
(`topk_to_host`), instead of ~9 MB of float32 logits and a host log_softmax over them.
daemon/speculative/dflash_topk.py is the definition (the reference backend runs it on the host).
"""
from __future__ import annotations

import numpy as np

from .tensor import DeviceTensor

__all__ = ["TopKOps", "TopKBuffers"]


class TopKBuffers:
    """Preallocated outputs for up to max_rows x max_k candidates, so a drafter step allocates nothing:
    one device block holding the float64 log-probs (n x 8 bytes) then the int32 ids (n x 4 bytes) of a
    call, read back in one copy. Grown (reallocated) when a call asks for more."""

    def __init__(self, dev, max_rows: int, max_k: int):
        self.dev, self.max_rows, self.max_k = dev, 0, 0
        self.raw = None
        self.ensure(max_rows, max_k)

    def ensure(self, rows: int, k: int) -> None:
        if rows <= self.max_rows and k <= self.max_k:
            return
        self.max_rows, self.max_k = max(rows, self.max_rows), max(k, self.max_k)
        self.raw = self.dev.empty((self.max_rows * self.max_k * 12,), np.uint8)

    def views(self, rows: int, k: int):
        """(ids int32 (rows, k), logprobs float64 (rows, k), packed uint8 (rows * k * 12,)) device views."""
        self.ensure(rows, k)
        n, raw = rows * k, self.raw
        lp = DeviceTensor(raw.ptr, (rows, k), np.dtype(np.float64), raw.owner)
        ids = DeviceTensor(raw.ptr + 8 * n, (rows, k), np.dtype(np.int32), raw.owner)
        return ids, lp, raw[:12 * n]


class TopKOps:
    """Mixed into CudaOps: needs self.dev, self.lib and self._check."""

    def topk_logprobs(self, logits, ids, logprobs, k: int, temperature: float) -> None:
        """fd_topk_logprobs: ids int32 (n, k) and logprobs float64 (n, k) from logits float32 (n, vocab)."""
        n, vocab = logits.shape
        if ids.shape != (n, k) or logprobs.shape != (n, k):
            raise ValueError(f"topk_logprobs: outputs {ids.shape} / {logprobs.shape} for {n} rows of top-{k}")
        if ids.dtype != np.int32 or logprobs.dtype != np.float64 or logits.dtype != np.float32:
            raise TypeError("topk_logprobs: logits float32, ids int32, logprobs float64")
        self._check(self.lib.fd_topk_logprobs(self.dev.p(ids), self.dev.p(logprobs, "double*"), self.dev.p(logits),
                                              n, vocab, k, float(temperature), self.dev.stream), "fd_topk_logprobs")

    def topk_on_device(self, logits, buffers: TopKBuffers, n_rows: int, k: int, temperature: float):
        """The top-k of logits' first n_rows rows into `buffers`, left on the device: (ids int32 (n_rows, k'),
        lp float64 (n_rows, k')) device views with k' = min(k, vocab), valid until the buffers' next call."""
        k = min(k, logits.shape[1])
        ids, lp, _ = buffers.views(n_rows, k)
        self.topk_logprobs(logits[:n_rows], ids, lp, k, temperature)
        return ids, lp

    def topk_to_host(self, logits, buffers: TopKBuffers, n_rows: int, k: int,
                     temperature: float) -> tuple[np.ndarray, np.ndarray]:
        """The top-k of logits' first n_rows rows, copied back: (ids int32 (n_rows, k'), lp float64 (n_rows, k'))
        with k' = min(k, vocab); one read-back of k' * 12 bytes per row."""
        k = min(k, logits.shape[1])
        self.topk_on_device(logits, buffers, n_rows, k, temperature)
        host = self.dev.download(buffers.views(n_rows, k)[2])    # one copy, one synchronisation
        n = n_rows * k
        return (host[8 * n:].view(np.int32).reshape(n_rows, k).copy(),
                host[:8 * n].view(np.float64).reshape(n_rows, k).copy())
