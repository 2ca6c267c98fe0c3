"""StagedInputs: the DFlash drafter's small per-step inputs (ids, positions, the context start, the
newly committed target features) in buffers it keeps, and its kept buffers (`buffer`: the pending
device-resident features).

On a backend with device memory (ops.dev: CUDA) each named input lives in one persistent device
buffer, grown to the largest input seen and filled by Device.upload_staged(out=...): a step allocates
nothing, where `ops.from_numpy` would cudaMalloc a block per input and cudaFree it when the
tensor is dropped (cudaFree synchronises the whole device: ~10 per step before this), and waits for
nothing (a synchronising upload made the host wait for the GPU at every input, ~6 times a draft
step, so each launch after it found the GPU idle). Other backends get `ops.from_numpy` (the
reference backend: the array itself).
"""
from __future__ import annotations

import numpy as np

__all__ = ["StagedInputs"]


class StagedInputs:
    def __init__(self, ops):
        self.ops = ops
        self.dev = getattr(ops, "dev", None)
        self.buffers: dict[str, object] = {}

    def put(self, name: str, array: np.ndarray):
        """`array` as a backend tensor in buffer `name` (valid until the next put of that name)."""
        array = np.ascontiguousarray(array)
        if self.dev is None:
            return self.ops.from_numpy(array)
        n = array.shape[0]
        buf = self.buffers.get(name)
        if buf is None or buf.shape[0] < n or buf.shape[1:] != array.shape[1:] or buf.dtype != array.dtype:
            buf = self.buffers[name] = self.dev.empty((max(n, 1),) + array.shape[1:], array.dtype)
        return self.dev.upload_staged(array, buf[:n])   # stream-ordered after the kernels that read it last

    def buffer(self, name: str, shape: tuple[int, ...], dtype=np.float32):
        """A kept backend tensor `name` of `shape` (contents undefined until written): device memory on
        CUDA, a numpy array on the reference backend. Made once; the same tensor on every call."""
        buf = self.buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != np.dtype(dtype):
            buf = self.dev.empty(shape, dtype) if self.dev is not None else np.zeros(shape, dtype)
            self.buffers[name] = buf
        return buf
