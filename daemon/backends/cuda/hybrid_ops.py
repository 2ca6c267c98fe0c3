"""HybridOps: the rest of what a hybrid (qwen35) model's forward asks of CudaOps beside the conv and delta-rule
kernels (recurrent_ops.py): the recurrent state, column splits, silu, sigmoid, the elementwise product, the L2
norm and the delta rule's decay. Each is composed from kernels the library already has where one fits:

    recurrent_state  CudaRecurrentState (recurrent_state.py): device buffers, zeroed with fd_memset
    split            fd_embed over a float32 "table" of g-wide pieces (g = gcd of the widths): exact row copies
                     (quant_float.cuh copies each float's 32 bits), one launch per part
    silu             pending (`Silu`): mul(a, silu(z)) is fd_swiglu(z, a) in one launch; materialized alone it
                     is fd_swiglu(x, ones)
    l2_norm          fd_rmsnorm with weight 1/sqrt(S) and eps/S: x * rsqrt(sum(x^2)/S + eps/S) / sqrt(S)
                     = x / sqrt(sum(x^2) + eps), the reference's formula up to float32 rounding

HOST_OPS have no kernel in the C ABI (flashd_linear.h has no sigmoid, softplus or elementwise product) and the
native code is not changed in this step: they run on the host, by the reference backend's own float32 formulas,
on a download of their inputs, and upload the result into the arena. That is exact (the reference's arithmetic)
but synchronizes the stream at every call, so a hybrid's forward cannot be captured in a CUDA graph: the CUDA
runner runs hybrids eagerly (hybrid_runner.py). Kernels for them are the follow-up that lifts this.

A mixin of CudaOps: needs self.dev, self.lib, self.take, self.p, self._check, self.materialize.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..base import RecurrentStateSpec
from ..reference import ReferenceOps
from .recurrent_state import CudaRecurrentState
from .tensor import DeviceTensor

__all__ = ["HybridOps", "Silu", "HOST_OPS"]

HOST_OPS = ("sigmoid", "mul", "delta_decay")   # mul of two plain tensors; mul(a, silu(z)) runs on the device
GGML_F32 = 0                                    # fd_embed's table type for the splits
MAX_SPLIT_INDICES = 256                         # cached id tensors of split (one per shape); cleared beyond
_HOST = ReferenceOps()                          # the formulas HOST_OPS use


@dataclass(slots=True, eq=False)
class Silu:
    """silu(x), not yet computed (mul fuses it; materialize computes it)."""

    x: DeviceTensor

    @property
    def shape(self):
        return self.x.shape

    def reshape(self, *shape) -> "Silu":
        return Silu(self.x.reshape(*shape))


class HybridOps:
    def _hybrid_init(self) -> None:
        """Empty caches of device constants (CudaOps.__init__; CudaOps.release drops them with the arena)."""
        self._split_ids: dict = {}     # (rows, pieces per row, first piece, pieces) -> int32 ids on the device
        self._ones: DeviceTensor | None = None
        self._l2_weights: dict = {}    # S -> (S,) float32 of float32(1 / sqrt(S))

    def recurrent_state(self, spec: RecurrentStateSpec) -> CudaRecurrentState:
        return CudaRecurrentState(self.dev, spec)

    # -- split ---------------------------------------------------------------------------------------------
    def split(self, x, sizes) -> tuple:
        """x (..., sum(sizes)) -> contiguous parts (..., sizes[i]) of its last axis, bit copies."""
        x = self.materialize(x)
        sizes = [int(s) for s in sizes]
        width = x.shape[-1]
        if sum(sizes) != width or min(sizes) < 1:
            raise ValueError(f"split of width {width} into {sizes}")
        g = math.gcd(width, *sizes)                     # piece width: every part is whole pieces
        rows, per = x.size // width, width // g
        table = x.reshape(rows * per, g)
        parts, first = [], 0
        for s in sizes:
            ids = self._split_index(rows, per, first, s // g)
            y = self.take((rows * (s // g), g))
            self._check(self.lib.fd_embed(self.p(y), self.p(table), GGML_F32, rows * per, g, self.p(ids),
                                          ids.shape[0], self.dev.stream), "fd_embed(split)")
            parts.append(y.reshape(*x.shape[:-1], s))
            first += s // g
        return tuple(parts)

    def _split_index(self, rows: int, per: int, first: int, count: int) -> DeviceTensor:
        """ids (rows * count,): piece r * per + first + c for row r, c < count (row-major, so the gathered
        (rows * count, g) output is the part (rows, count * g))."""
        key = (rows, per, first, count)
        ids = self._split_ids.get(key)
        if ids is None:
            if len(self._split_ids) >= MAX_SPLIT_INDICES:
                self._split_ids.clear()
            host = (np.arange(rows, dtype=np.int64)[:, None] * per + first + np.arange(count)).astype(np.int32)
            ids = self._split_ids[key] = self.dev.upload(host.reshape(-1))
        return ids

    # -- elementwise ---------------------------------------------------------------------------------------
    def silu(self, x) -> Silu:
        return Silu(self.materialize(x))

    def _silu_now(self, s: Silu) -> DeviceTensor:
        out = self.take(s.x.shape)
        self._check(self.lib.fd_swiglu(self.p(out), self.p(s.x), self.p(self._ones_of(s.x.size)), s.x.size,
                                       self.dev.stream), "fd_swiglu(silu)")
        return out

    def _ones_of(self, n: int) -> DeviceTensor:
        """A float32 tensor of n ones (a view of one buffer grown to a power of two; outside the arena)."""
        if self._ones is None or self._ones.size < n:
            self._ones = self.dev.upload(np.ones(1 << max(n - 1, 1).bit_length(), np.float32))
        return self._ones[:n]

    def mul(self, a, b):
        """a * b, same shapes. With a pending silu on either side: fd_swiglu (device); else HOST_OPS."""
        if isinstance(a, Silu):
            a, b = b, a
        if isinstance(b, Silu):
            a = self.materialize(a)
            if a.size != b.x.size:
                raise ValueError(f"mul: shapes {a.shape} and {b.shape}")
            out = self.take(b.x.shape)
            self._check(self.lib.fd_swiglu(self.p(out), self.p(b.x), self.p(a), a.size, self.dev.stream),
                        "fd_swiglu(mul)")
            return out
        a, b = self.materialize(a), self.materialize(b)
        if tuple(a.shape) != tuple(b.shape):
            raise ValueError(f"mul: shapes {a.shape} and {b.shape}")
        return self._on_host(_HOST.mul(self.to_numpy(a), self.to_numpy(b)))

    def sigmoid(self, x) -> DeviceTensor:
        return self._on_host(_HOST.sigmoid(self.to_numpy(x)))

    def delta_decay(self, alpha, dt_bias, a) -> DeviceTensor:
        """softplus(alpha + dt_bias) * a, (n, Hv): HOST_OPS (softplus)."""
        return self._on_host(_HOST.delta_decay(self.to_numpy(alpha), self.to_numpy(dt_bias), self.to_numpy(a)))

    def _on_host(self, result: np.ndarray) -> DeviceTensor:
        result = np.ascontiguousarray(result, np.float32)
        return self.dev.upload(result, out=self.take(result.shape))

    def l2_norm(self, x, eps: float) -> DeviceTensor:
        """x / sqrt(sum(x^2 over the last axis) + eps) as fd_rmsnorm (the module docstring says how)."""
        x = self.materialize(x)
        S = x.shape[-1]
        w = self._l2_weights.get(S)
        if w is None:
            w = self._l2_weights[S] = self.dev.upload(np.full(S, 1.0 / math.sqrt(S), np.float32))
        out = self.take(x.shape)
        self._check(self.lib.fd_rmsnorm(self.p(out), self.p(x), self.p(w), x.size // S, S, float(eps) / S,
                                        self.dev.stream), "fd_rmsnorm(l2_norm)")
        return out
