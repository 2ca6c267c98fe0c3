"""HybridOps: the rest of what a hybrid (qwen35) model's forward asks of CudaOps beside the conv and delta-rule
kernels (recurrent_ops.py): the recurrent state, column splits, silu, sigmoid, the elementwise product, the L2
norm and the delta rule's decay. One C entry point per op (ABI 13), all on the device:

    recurrent_state  CudaRecurrentState (recurrent_state.py): device buffers, zeroed with fd_memset
    split            one row (the decode step): views of x's contiguous column ranges, no launch; several rows:
                     fd_copy_cols, one launch per part: bit copies of x[..., a:b]
    silu             pending (`Silu`): mul(a, silu(z)) is fd_swiglu(z, a) in one launch; materialized alone it
                     is fd_silu (the same bits as fd_swiglu(x, ones))
    sigmoid          pending (`Sigmoid`): mul(x, sigmoid(gate)) -- the gated attention's output gate -- is
                     fd_sigmoid_mul in one launch; materialized alone (the delta rule's beta) fd_sigmoid
    mul              of two plain tensors: fd_mul
    delta_decay      fd_delta_decay: softplus(alpha + dt_bias) * a, (n, Hv)
    l2_norm          fd_rmsnorm with weight 1/sqrt(S) and eps/S: x * rsqrt(sum(x^2)/S + eps/S) / sqrt(S)
                     = x / sqrt(sum(x^2) + eps), the reference's formula up to float32 rounding

models/qwen35.py asks for the fused ops (fused_ops.py: one kernel each) and reaches silu, sigmoid, l2_norm,
delta_decay and split only through the composition (backends/base.py HybridFusedDefaults) where a shape is past the
fused kernels, and through the gated attention's mul(o, sigmoid(gate)) (fd_sigmoid_mul).

sigmoid and delta_decay follow the reference backend's float32 steps (backends/reference.py; elementwise.cu and
delta_decay.cu say how), equal to it within an ulp or two; mul, split and the products are exact.

No op here synchronizes the stream, uploads or downloads, so a hybrid's decode step can be captured in a CUDA graph
(hybrid_runner.py). The only constant a forward reads that is not in the arena is l2_norm's weight per head size,
made on first use and kept until release(); `prepare_capture(cfg)` makes it before a capture, where an upload is
illegal.

A mixin of CudaOps: needs self.dev, self.lib, self.take, self.p, self._check, self.materialize.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..base import RecurrentStateSpec
from .recurrent_state import CudaRecurrentState
from .tensor import DeviceTensor

__all__ = ["HybridOps", "Silu", "Sigmoid"]


@dataclass(slots=True, eq=False)
class Silu:
    """silu(x), not yet computed (mul fuses it; materialize computes it)."""

    x: DeviceTensor

    @property
    def shape(self):
        return self.x.shape

    def reshape(self, *shape) -> "Silu":
        return Silu(self.x.reshape(*shape))


@dataclass(slots=True, eq=False)
class Sigmoid:
    """sigmoid(x), not yet computed (mul fuses it; materialize computes it)."""

    x: DeviceTensor

    @property
    def shape(self):
        return self.x.shape

    def reshape(self, *shape) -> "Sigmoid":
        return Sigmoid(self.x.reshape(*shape))


def _same_shape(a, b, what: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{what}: shapes {tuple(a.shape)} and {tuple(b.shape)}")


def _f32(what: str, *tensors) -> None:
    for t in tensors:
        if np.dtype(t.dtype) != np.float32:
            raise TypeError(f"{what} takes float32 tensors, got {t.dtype}")


class HybridOps:
    def _hybrid_init(self) -> None:
        """Empty cache of device constants (CudaOps.__init__; CudaOps.release drops it with the arena)."""
        self._l2_weights: dict = {}    # S -> (S,) float32 of float32(1 / sqrt(S))

    def prepare_capture(self, cfg) -> None:
        """Make the constants a hybrid forward of `cfg` reads (l2_norm's weight) now: inside a graph capture an
        upload is illegal (CudaHybridRunner calls this before every capture)."""
        self._l2_weight(cfg.linear.head_dim)

    def recurrent_state(self, spec: RecurrentStateSpec) -> CudaRecurrentState:
        return CudaRecurrentState(self.dev, spec)

    # -- split ---------------------------------------------------------------------------------------------
    def split(self, x, sizes) -> tuple:
        """x (..., sum(sizes)) -> contiguous parts (..., sizes[i]) of its last axis. One row whose parts start on
        16-byte boundaries (the vector kernels' loads): views into x (a decode step's 3 copy launches a linear layer
        cost ~4 us; bench/NOTES.md session 14); otherwise fd_copy_cols, bit copies."""
        x = self.materialize(x)
        _f32("split", x)
        sizes = [int(s) for s in sizes]
        width = x.shape[-1]
        if sum(sizes) != width or min(sizes) < 1:
            raise ValueError(f"split of width {width} into {sizes}")
        rows = x.size // width
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        if rows == 1 and all(c % 4 == 0 for c in starts):
            flat = x.reshape(width)
            return tuple(flat[c:c + s].reshape(*x.shape[:-1], s) for c, s in zip(starts, sizes))
        parts, col0 = [], 0
        for s in sizes:
            y = self.take((rows, s))
            self._check(self.lib.fd_copy_cols(self.p(y), self.p(x), rows, width, col0, s, self.dev.stream),
                        "fd_copy_cols(split)")
            parts.append(y.reshape(*x.shape[:-1], s))
            col0 += s
        return tuple(parts)

    # -- elementwise ---------------------------------------------------------------------------------------
    def silu(self, x) -> Silu:
        return Silu(self.materialize(x))

    def _silu_now(self, s: Silu) -> DeviceTensor:
        out = self.take(s.x.shape)
        self._check(self.lib.fd_silu(self.p(out), self.p(s.x), s.x.size, self.dev.stream), "fd_silu")
        return out

    def sigmoid(self, x) -> Sigmoid:
        x = self.materialize(x)
        _f32("sigmoid", x)
        return Sigmoid(x)

    def _sigmoid_now(self, s: Sigmoid) -> DeviceTensor:
        out = self.take(s.x.shape)
        self._check(self.lib.fd_sigmoid(self.p(out), self.p(s.x), s.x.size, self.dev.stream), "fd_sigmoid")
        return out

    def mul(self, a, b):
        """a * b, same shapes: fd_swiglu with a pending silu on either side (silu(z) * a), fd_sigmoid_mul with a
        pending sigmoid (a * sigmoid(gate)), else fd_mul. Where both are pending the silu is fused."""
        if isinstance(a, (Silu, Sigmoid)) and not isinstance(b, Silu):
            a, b = b, a                                  # the pending factor second
        if isinstance(b, (Silu, Sigmoid)):
            a = self.materialize(a)
            _same_shape(a, b, "mul")
            _f32("mul", a)
            out = self.take(b.x.shape)
            if isinstance(b, Silu):
                self._check(self.lib.fd_swiglu(self.p(out), self.p(b.x), self.p(a), a.size, self.dev.stream),
                            "fd_swiglu(mul)")
            else:
                self._check(self.lib.fd_sigmoid_mul(self.p(out), self.p(a), self.p(b.x), a.size, self.dev.stream),
                            "fd_sigmoid_mul")
            return out
        a, b = self.materialize(a), self.materialize(b)
        _same_shape(a, b, "mul")
        _f32("mul", a, b)
        out = self.take(a.shape)
        self._check(self.lib.fd_mul(self.p(out), self.p(a), self.p(b), a.size, self.dev.stream), "fd_mul")
        return out

    def delta_decay(self, alpha, dt_bias, a) -> DeviceTensor:
        """fd_delta_decay: g (n, Hv) = softplus(alpha + dt_bias) * a, alpha (n, Hv), dt_bias and a (Hv,)."""
        alpha, dt_bias, a = (self.materialize(t) for t in (alpha, dt_bias, a))
        _f32("delta_decay", alpha, dt_bias, a)
        if alpha.ndim != 2 or tuple(dt_bias.shape) != (alpha.shape[1],) or tuple(a.shape) != (alpha.shape[1],):
            raise ValueError(f"delta_decay: alpha (n, Hv), dt_bias and a (Hv,) expected, got {tuple(alpha.shape)}, "
                             f"{tuple(dt_bias.shape)}, {tuple(a.shape)}")
        n, hv = alpha.shape
        g = self.take((n, hv))
        self._check(self.lib.fd_delta_decay(self.p(g), self.p(alpha), self.p(dt_bias), self.p(a), n, hv,
                                            self.dev.stream), "fd_delta_decay")
        return g

    def l2_norm(self, x, eps: float) -> DeviceTensor:
        """x / sqrt(sum(x^2 over the last axis) + eps) as fd_rmsnorm (the module docstring says how)."""
        x = self.materialize(x)
        S = x.shape[-1]
        w = self._l2_weight(S)
        out = self.take(x.shape)
        self._check(self.lib.fd_rmsnorm(self.p(out), self.p(x), self.p(w), x.size // S, S, float(eps) / S,
                                        self.dev.stream), "fd_rmsnorm(l2_norm)")
        return out

    def _l2_weight(self, S: int) -> DeviceTensor:
        """(S,) float32 of float32(1 / sqrt(S)), made once (an upload: never inside a capture, prepare_capture)."""
        w = self._l2_weights.get(S)
        if w is None:
            w = self._l2_weights[S] = self.dev.upload(np.full(S, 1.0 / math.sqrt(S), np.float32))
        return w
