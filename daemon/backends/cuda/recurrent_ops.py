"""RecurrentOps: a hybrid (qwen35) model's recurrent-layer ops on the GPU -- the short causal convolution with its
state and the gated delta rule (native/include/flashd_recurrent.h; native/cuda/causal_conv1d.cu,
gated_delta_rule.cu).

A mixin of CudaOps (same device, stream, arena and status checks). One name per op, kernel to C entry point to
method: `causal_conv1d` fd_causal_conv1d, `causal_conv1d_tree` fd_causal_conv1d_tree, `gated_delta_rule_decode`
fd_gated_delta_rule_decode, `gated_delta_rule_prefill` fd_gated_delta_rule_prefill, `gated_delta_rule_tree`
fd_gated_delta_rule_tree; `gated_delta_rule` (the Ops interface's name) runs decode for one token, prefill for
more. The numpy definitions are backends/reference_recurrent.py and reference_recurrent_tree.py.

Every method checks shapes and dtypes here, before the C ABI (ValueError / TypeError; the kernels cannot check
a tensor's extent), and takes its output from the arena. States are float32 tensors the caller owns and are
updated in place (the tree forms: the committed state read only, the node buffers written). A tree's `parents`
is an int32 device tensor (parents[i] < i, -1 for the committed context) that cannot be checked here without a
copy back; the kernels give NaN for a node with an invalid parent.

The GPU prefill is the recurrent form run token by token (gated_delta_rule.cu says why), so a prefilled state
equals the reference's chunked form only up to rounding, and equals GPU decode steps bit for bit.

A qwen35 forward on CudaOps uses them with hybrid_ops.py (the rest of its ops) and recurrent_state.py (the state).
"""
from __future__ import annotations

import numpy as np

__all__ = ["RecurrentOps", "CONV_MAX_K", "DELTA_MAX_DK", "delta_scale"]

CONV_MAX_K = 8          # flashd_recurrent.h FD_CONV_MAX_K
DELTA_MAX_DK = 256      # flashd_recurrent.h FD_DELTA_MAX_DK
GGML_F32 = 0            # a GGUF float32 weight (QuantWeight.qtype): its bytes are the (C, K) floats


def delta_scale(head_dim: int) -> float:
    """The output scale as the reference forms it: float32(1 / sqrt(S)) (reference_recurrent.py)."""
    return float(np.float32(1.0 / np.sqrt(head_dim)))


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


def _float32(**tensors) -> None:
    bad = [f"{name} {t.dtype}" for name, t in tensors.items() if np.dtype(t.dtype) != np.float32]
    if bad:
        raise TypeError(f"recurrent ops take float32 tensors: {', '.join(bad)}")


def _parents(parents, n: int) -> None:
    if np.dtype(parents.dtype) != np.int32:
        raise TypeError(f"tree parents must be int32, got {parents.dtype}")
    _need(tuple(parents.shape) == (n,), f"tree parents: expected shape ({n},), got {tuple(parents.shape)}")


class RecurrentOps:
    """Mixed into CudaOps: needs self.dev, self.lib, self.take, self._check and self.materialize."""

    # -- causal conv1d ---------------------------------------------------------------------------------------
    def _conv_weight(self, weight, channels: int):
        """(pointer, K) of a (C, K) float32 weight: a DeviceTensor, or a GGUF F32 QuantWeight (raw bytes)."""
        if hasattr(weight, "qtype"):
            if weight.qtype != GGML_F32:
                raise TypeError(f"causal_conv1d weight: GGML type {weight.qtype}, float32 (0) expected")
            rows, taps, ptr = weight.rows, weight.cols, self.dev.p(weight.data, "float*")
        else:
            _float32(weight=weight)
            _need(weight.ndim == 2, f"causal_conv1d weight: (C, K) expected, got {tuple(weight.shape)}")
            (rows, taps), ptr = weight.shape, self.dev.p(weight)
        _need(rows == channels, f"causal_conv1d weight: {rows} channels, x has {channels}")
        _need(2 <= taps <= CONV_MAX_K, f"causal_conv1d: {taps} taps, 2..{CONV_MAX_K} supported")
        return ptr, int(taps)

    def _conv_shapes(self, x, weight, conv_state):
        _float32(x=x, conv_state=conv_state)
        _need(x.ndim == 2, f"causal_conv1d x: (n, C) expected, got {tuple(x.shape)}")
        n, channels = x.shape
        w_ptr, taps = self._conv_weight(weight, channels)
        _need(tuple(conv_state.shape) == (taps - 1, channels),
              f"causal_conv1d conv_state: ({taps - 1}, {channels}) expected, got {tuple(conv_state.shape)}")
        return n, channels, taps, w_ptr

    def causal_conv1d(self, x, weight, conv_state):
        """fd_causal_conv1d: y (n, C) of x (n, C) after conv_state's K - 1 inputs; conv_state (K - 1, C) updated."""
        n, channels, taps, w_ptr = self._conv_shapes(x, weight, conv_state)
        y = self.take((n, channels))
        self._check(self.lib.fd_causal_conv1d(self.p(y), self.p(x), w_ptr, self.p(conv_state), n, channels, taps,
                                              self.dev.stream), "fd_causal_conv1d")
        return y

    def causal_conv1d_tree(self, x, weight, conv_state, parents, node_conv):
        """fd_causal_conv1d_tree: y (n, C), node i after its parent's window; conv_state (K - 1, C) read only,
        node_conv (>= n, K - 1, C) gets each node's window."""
        n, channels, taps, w_ptr = self._conv_shapes(x, weight, conv_state)
        _parents(parents, n)
        _float32(node_conv=node_conv)
        _need(node_conv.ndim == 3 and node_conv.shape[0] >= n and tuple(node_conv.shape[1:]) == (taps - 1, channels),
              f"causal_conv1d_tree node_conv: (>= {n}, {taps - 1}, {channels}) expected, got {tuple(node_conv.shape)}")
        y = self.take((n, channels))
        self._check(self.lib.fd_causal_conv1d_tree(self.p(y), self.p(x), w_ptr, self.p(conv_state), self.p(parents),
                                                   self.p(node_conv), n, channels, taps, self.dev.stream),
                    "fd_causal_conv1d_tree")
        return y

    # -- gated delta rule ------------------------------------------------------------------------------------
    def _delta_shapes(self, q, k, v, g, beta, state) -> tuple[int, int, int, int, int]:
        """(n, Hk, Hv, d_k, d_v), or ValueError / TypeError naming what does not fit flashd_recurrent.h. The inputs
        are materialized tensors (the callers' _delta_inputs: beta may come as hybrid_ops' pending Sigmoid)."""
        _float32(q=q, k=k, v=v, g=g, beta=beta, state=state)
        _need(q.ndim == 3 and v.ndim == 3, f"gated_delta_rule: q (n, Hk, d_k) and v (n, Hv, d_v) expected, got "
                                           f"{tuple(q.shape)} and {tuple(v.shape)}")
        n, hk, dk = q.shape
        _, hv, dv = v.shape
        _need(tuple(k.shape) == (n, hk, dk), f"gated_delta_rule k: {tuple(k.shape)}, q is {tuple(q.shape)}")
        _need(v.shape[0] == n, f"gated_delta_rule: v has {v.shape[0]} tokens, q {n}")
        for name, t in (("g", g), ("beta", beta)):
            _need(tuple(t.shape) == (n, hv), f"gated_delta_rule {name}: ({n}, {hv}) expected, got {tuple(t.shape)}")
        _need(tuple(state.shape) == (hv, dk, dv),
              f"gated_delta_rule state: ({hv}, {dk}, {dv}) expected, got {tuple(state.shape)}")
        _need(hk > 0 and hv % hk == 0, f"gated_delta_rule: {hv} value heads are not a multiple of {hk} key heads")
        _need(1 <= dk <= DELTA_MAX_DK, f"gated_delta_rule: d_k {dk}, 1..{DELTA_MAX_DK} supported")
        _need(dv >= 1, "gated_delta_rule: d_v must be positive")
        return n, hk, hv, dk, dv

    def _delta_inputs(self, *tensors):
        return tuple(self.materialize(t) for t in tensors)

    def gated_delta_rule(self, q, k, v, g, beta, state, scale: float | None = None):
        """Ops.gated_delta_rule: one token -> gated_delta_rule_decode, more -> gated_delta_rule_prefill."""
        if q.shape[0] == 1:
            return self.gated_delta_rule_decode(q, k, v, g, beta, state, scale)
        return self.gated_delta_rule_prefill(q, k, v, g, beta, state, scale)

    def gated_delta_rule_decode(self, q, k, v, g, beta, state, scale: float | None = None):
        """fd_gated_delta_rule_decode: one token, q, k (1, Hk, d_k), v (1, Hv, d_v), g, beta (1, Hv); state
        (Hv, d_k, d_v) updated; returns out (1, Hv, d_v). scale defaults to float32(1 / sqrt(d_v))."""
        q, k, v, g, beta = self._delta_inputs(q, k, v, g, beta)
        n, hk, hv, dk, dv = self._delta_shapes(q, k, v, g, beta, state)
        _need(n == 1, f"gated_delta_rule_decode: one token, got {n} (gated_delta_rule_prefill takes more)")
        out = self.take((1, hv, dv))
        self._check(self.lib.fd_gated_delta_rule_decode(
            self.p(out), self.p(q), self.p(k), self.p(v), self.p(g), self.p(beta), self.p(state), hk, hv, dk, dv,
            delta_scale(dv) if scale is None else float(scale), self.dev.stream), "fd_gated_delta_rule_decode")
        return out

    def gated_delta_rule_prefill(self, q, k, v, g, beta, state, scale: float | None = None):
        """fd_gated_delta_rule_prefill: n tokens in order (shapes as decode with n rows); state updated."""
        q, k, v, g, beta = self._delta_inputs(q, k, v, g, beta)
        n, hk, hv, dk, dv = self._delta_shapes(q, k, v, g, beta, state)
        out = self.take((n, hv, dv))
        self._check(self.lib.fd_gated_delta_rule_prefill(
            self.p(out), self.p(q), self.p(k), self.p(v), self.p(g), self.p(beta), self.p(state), n, hk, hv, dk, dv,
            delta_scale(dv) if scale is None else float(scale), self.dev.stream), "fd_gated_delta_rule_prefill")
        return out

    def gated_delta_rule_tree(self, q, k, v, g, beta, state, parents, node_state, scale: float | None = None):
        """fd_gated_delta_rule_tree: node i from its parent's memory; state (Hv, d_k, d_v) read only, node_state
        (>= n, Hv, d_k, d_v) gets each node's memory; returns out (n, Hv, d_v)."""
        q, k, v, g, beta = self._delta_inputs(q, k, v, g, beta)
        n, hk, hv, dk, dv = self._delta_shapes(q, k, v, g, beta, state)
        _parents(parents, n)
        _float32(node_state=node_state)
        _need(node_state.ndim == 4 and node_state.shape[0] >= n and tuple(node_state.shape[1:]) == (hv, dk, dv),
              f"gated_delta_rule_tree node_state: (>= {n}, {hv}, {dk}, {dv}) expected, got {tuple(node_state.shape)}")
        out = self.take((n, hv, dv))
        self._check(self.lib.fd_gated_delta_rule_tree(
            self.p(out), self.p(q), self.p(k), self.p(v), self.p(g), self.p(beta), self.p(state), self.p(parents),
            self.p(node_state), n, hk, hv, dk, dv, delta_scale(dv) if scale is None else float(scale),
            self.dev.stream), "fd_gated_delta_rule_tree")
        return out
