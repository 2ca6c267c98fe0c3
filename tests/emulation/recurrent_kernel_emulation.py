"""A host stand-in of libflashd whose fd_causal_conv1d* and fd_gated_delta_rule_* run the kernels' arithmetic in
numpy (native/cuda/causal_conv1d.cu, gated_delta_rule.cu): the same argument checks and status codes, the conv's
fmaf chain over k = 0 .. K-1, the delta rule's per-warp fmaf chains over rows i = warp + 8p summed in warp order,
the decay rounded from a double exp, value head h reading key head h % Hk, the tree's reload from the parent's
node state and NaN for an invalid parent. Memory is host memory (tests/cuda_on_host's HostMemoryLib).

fmaf(a, b, c) is emulated as float32(double(a) double(b) + double(c)): the product is exact in double, the sum
is rounded twice (double, then float), which can differ from one rounding in the last bit on rare inputs -- fine
for what this serves (test_recurrent_emulation.py: the GPU tests' logic and the kernels' index math on the CPU).
"""
from __future__ import annotations

import numpy as np

from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative

F32 = np.float32
WARPS = 8                   # gated_delta_rule.cu DR_WARPS
CONV_MAX_K, DELTA_MAX_DK = 8, 256


def fma(a, b, c) -> np.ndarray:
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(F32)


def conv_out(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """causal_conv1d.cu conv_out: u (K, C) the window, w (C, K) -> (C,), one fmaf chain from 0."""
    acc = np.zeros(u.shape[1], F32)
    for k in range(w.shape[1]):
        acc = fma(u[k], w[:, k], acc)
    return acc


def warps_sum(m: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """gated_delta_rule.cu's column dot product: m (Hv, d_k, d_v), vec (Hv, d_k) -> (Hv, d_v); warp w's fmaf
    chain over rows w, w + 8, ..., then the 8 partials added in warp order."""
    total = np.zeros((m.shape[0], m.shape[2]), F32)
    for w in range(WARPS):
        part = np.zeros_like(total)
        for i in range(w, m.shape[1], WARPS):
            part = fma(m[:, i, :], vec[:, i, None], part)
        total = (total + part).astype(F32)
    return total


def token_step(m, k, q, g, beta, v) -> np.ndarray:
    """One token on every head's memory m (Hv, d_k, d_v) in place; returns (M^T q), unscaled (Hv, d_v)."""
    m *= np.exp(g.astype(np.float64)).astype(F32)[:, None, None]
    delta = ((v - warps_sum(m, k)) * beta[:, None]).astype(F32)
    for i in range(m.shape[1]):
        m[:, i, :] = fma(k[:, i, None], delta, m[:, i, :])
    return warps_sum(m, q)


class RecurrentKernelLib(HostMemoryLib):
    FD_E_ARG, FD_E_SHAPE = -1, -3

    def _a(self, p, shape, dtype=F32) -> np.ndarray:
        n = int(np.prod(shape))
        return np.frombuffer(self.ffi.buffer(self.ffi.cast("char*", p), n * np.dtype(dtype).itemsize),
                             dtype).reshape(shape)

    def _null(self, *ptrs) -> bool:
        return any(p == self.ffi.NULL for p in ptrs)

    def fd_memset(self, p, byte, n, stream):
        self._a(p, (n,), np.uint8)[...] = byte
        return 0

    def fd_device_count(self, out):
        out[0] = 1
        return 0

    def _conv_check(self, y, x, w, s, n, c, k) -> int:
        if self._null(y, x, w, s) or n < 0 or c <= 0 or k < 2:
            return self.FD_E_ARG
        return self.FD_E_SHAPE if k > CONV_MAX_K else 0

    def fd_causal_conv1d(self, y, x, w, s, n, c, k, stream):
        status = self._conv_check(y, x, w, s, n, c, k)
        if status or n == 0:
            return status
        W, S, Y = self._a(w, (c, k)), self._a(s, (k - 1, c)), self._a(y, (n, c))
        u = np.concatenate([S, self._a(x, (n, c))])
        for t in range(n):
            Y[t] = conv_out(u[t:t + k], W)
        S[...] = u[n:]
        return 0

    def fd_causal_conv1d_tree(self, y, x, w, s, parents, node, n, c, k, stream):
        status = self._conv_check(y, x, w, s, n, c, k)
        if status or self._null(parents, node):
            return status or self.FD_E_ARG
        X, W, S, Y = self._a(x, (n, c)), self._a(w, (c, k)), self._a(s, (k - 1, c)), self._a(y, (n, c))
        P, N = self._a(parents, (n,), np.int32), self._a(node, (n, k - 1, c))
        for i in range(n):
            p = int(P[i])
            u = np.concatenate([S if p < 0 else N[p], X[i:i + 1]]) if -1 <= p < i else np.full((k, c), np.nan, F32)
            Y[i] = conv_out(u, W)
            N[i] = u[1:]
        return 0

    def _delta_check(self, ptrs, n, hk, hv, dk, dv, scale) -> int:
        if self._null(*ptrs) or n < 0 or hk <= 0 or hv <= 0 or hv % hk or dk <= 0 or dv <= 0:
            return self.FD_E_ARG
        if not (scale > 0 and np.isfinite(scale)):
            return self.FD_E_ARG
        return self.FD_E_SHAPE if dk > DELTA_MAX_DK or hv > 65535 else 0

    def _tokens(self, out, q, k, v, g, beta, n, hk, hv, dk, dv, scale, m, tree=None):
        """The kernel's token loop over m (Hv, d_k, d_v); tree = (parents, node states, committed state)."""
        Q, K = self._a(q, (n, hk, dk)), self._a(k, (n, hk, dk))
        V, G, B, O = self._a(v, (n, hv, dv)), self._a(g, (n, hv)), self._a(beta, (n, hv)), self._a(out, (n, hv, dv))
        key_head = np.arange(hv) % hk
        for t in range(n):
            if tree is not None and int(tree[0][t]) != t - 1:
                p = int(tree[0][t])
                m[...] = (tree[2] if p < 0 else tree[1][p]) if -1 <= p < t else np.nan
            O[t] = (token_step(m, K[t][key_head], Q[t][key_head], G[t], B[t], V[t]) * F32(scale)).astype(F32)
            if tree is not None:
                tree[1][t] = m

    def fd_gated_delta_rule_prefill(self, out, q, k, v, g, beta, state, n, hk, hv, dk, dv, scale, stream):
        status = self._delta_check((out, q, k, v, g, beta, state), n, hk, hv, dk, dv, scale)
        if status or n == 0:
            return status
        S = self._a(state, (hv, dk, dv))
        m = S.copy()
        self._tokens(out, q, k, v, g, beta, n, hk, hv, dk, dv, scale, m)
        S[...] = m
        return 0

    def fd_gated_delta_rule_decode(self, out, q, k, v, g, beta, state, hk, hv, dk, dv, scale, stream):
        return self.fd_gated_delta_rule_prefill(out, q, k, v, g, beta, state, 1, hk, hv, dk, dv, scale, stream)

    def fd_gated_delta_rule_tree(self, out, q, k, v, g, beta, state, parents, node, n, hk, hv, dk, dv, scale,
                                 stream):
        status = self._delta_check((out, q, k, v, g, beta, state), n, hk, hv, dk, dv, scale)
        if status or self._null(parents, node):
            return status or self.FD_E_ARG
        if n == 0:
            return 0
        S = self._a(state, (hv, dk, dv))
        tree = (self._a(parents, (n,), np.int32), self._a(node, (n, hv, dk, dv)), S)
        self._tokens(out, q, k, v, g, beta, n, hk, hv, dk, dv, scale, S.copy(), tree)
        return 0


class RecurrentKernelNative(HostNative):
    def __init__(self):
        super().__init__()
        self.lib = RecurrentKernelLib(self.ffi)
