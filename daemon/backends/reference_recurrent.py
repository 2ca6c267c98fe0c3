"""Numpy oracles of a hybrid model's recurrent layers (Gated DeltaNet, qwen35): the short causal convolution with
its state, and the gated delta rule in its recurrent form (decode: one token at a time) and its chunked form
(prefill: a chunk of tokens with matrix products, equal to the recurrent form up to rounding).

The math is llama.cpp's (ggml's ssm_conv and gated_delta_net ops, src/models/delta-net-base.cpp). Every function
keeps its inputs' dtype (float32 in the backend, float64 in the tests that compare the two forms) and updates the
state it is given in place.

Shapes: n tokens, C conv channels, K taps; Hk query/key heads, Hv value heads (value head h reads key head
h % Hk, as ggml does), S the head size; the state of one value head is S x S, indexed [key i, value j].

Gated delta rule, per value head, for each token t (q and k L2-normalized by the caller, scale = 1/sqrt(S)):
    M <- exp(g_t) M                           (decay; g_t <= 0)
    delta = beta_t (v_t - M^T k_t)            (what the memory gets wrong about v_t)
    M <- M + k_t delta^T                      (the delta rule's write)
    o_t = scale M^T q_t
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["causal_conv1d", "delta_rule_recurrent", "delta_rule_chunked", "DELTA_CHUNK"]

DELTA_CHUNK = 64      # tokens per chunk of the chunked form (llama.cpp's non-fused chunked graph uses 64 too)


def causal_conv1d(x: np.ndarray, weight: np.ndarray, state: np.ndarray) -> np.ndarray:
    """x (n, C), weight (C, K), state (K - 1, C): the K - 1 inputs before x. Returns y (n, C) with
    y[t, c] = sum_k u[t + k, c] weight[c, k] over u = concat(state, x); the state becomes the last K - 1 rows of
    u (ggml_ssm_conv over llama.cpp's conv state)."""
    u = np.concatenate([state, x], axis=0)                       # (K - 1 + n, C)
    windows = sliding_window_view(u, weight.shape[1], axis=0)    # (n, C, K)
    y = np.einsum("nck,ck->nc", windows, weight)
    state[...] = u[u.shape[0] - state.shape[0]:]
    return y.astype(x.dtype, copy=False)


def _per_value_head(a: np.ndarray, n_v_heads: int) -> np.ndarray:
    """(n, Hk, S) -> (n, Hv, S): value head h reads key head h % Hk (ggml's broadcast)."""
    return a[:, np.arange(n_v_heads) % a.shape[1]]


def delta_rule_recurrent(q, k, v, g, beta, state) -> np.ndarray:
    """The gated delta rule one token at a time. q, k (n, Hk, S); v (n, Hv, S); g, beta (n, Hv); state
    (Hv, S, S) updated in place. Returns o (n, Hv, S)."""
    n, n_v_heads, head = v.shape
    qh, kh = _per_value_head(q, n_v_heads), _per_value_head(k, n_v_heads)
    scale = v.dtype.type(1.0 / np.sqrt(head))
    out = np.empty_like(v)
    for t in range(n):
        state *= np.exp(g[t])[:, None, None]
        delta = (v[t] - np.einsum("hij,hi->hj", state, kh[t])) * beta[t][:, None]
        state += kh[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hij,hi->hj", state, qh[t]) * scale
    return out


def delta_rule_chunked(q, k, v, g, beta, state, chunk: int = DELTA_CHUNK) -> np.ndarray:
    """The gated delta rule over chunks of `chunk` tokens; equal to delta_rule_recurrent up to rounding.

    Within a chunk starting from memory M0, with G_t = g_1 + ... + g_t (cumulative decay) and the writes
    delta_t of the recurrent form as unknowns U:
        delta_t = beta_t (v_t - exp(G_t) M0^T k_t - sum_{j<t} exp(G_t - G_j) (k_t . k_j) delta_j)
    i.e. (I + L) U = beta (V - exp(G) K M0) with L[t, j] = beta_t exp(G_t - G_j) (k_t . k_j) for j < t, a unit
    lower-triangular system; then
        o_t = scale (exp(G_t) M0^T q_t + sum_{j<=t} exp(G_t - G_j) (q_t . k_j) delta_j)
        M_end = exp(G_last) M0 + sum_j exp(G_last - G_j) k_j delta_j^T
    """
    n, n_v_heads, head = v.shape
    qh, kh = _per_value_head(q, n_v_heads), _per_value_head(k, n_v_heads)
    scale = v.dtype.type(1.0 / np.sqrt(head))
    out = np.empty_like(v)
    for c0 in range(0, n, chunk):
        sl = slice(c0, min(n, c0 + chunk))
        out[sl] = _delta_chunk(qh[sl].swapaxes(0, 1) * scale, kh[sl].swapaxes(0, 1), v[sl].swapaxes(0, 1),
                               g[sl].T, beta[sl].T, state).swapaxes(0, 1)
    return out


def _delta_chunk(Q, K, V, g, beta, M):
    """One chunk, heads first: Q, K, V (Hv, C, S) (Q scaled), g, beta (Hv, C), M (Hv, S, S) in place."""
    C = Q.shape[1]
    G = np.cumsum(g, axis=1)                                        # (Hv, C)
    diff = G[:, :, None] - G[:, None, :]                            # G_t - G_j
    causal = np.tril(np.ones((C, C), bool))
    decay = np.where(causal, np.exp(np.where(causal, diff, 0)), 0).astype(V.dtype)   # j <= t
    strict = decay * ~np.eye(C, dtype=bool)
    eG = np.exp(G).astype(V.dtype)
    L = beta[:, :, None] * (K @ K.swapaxes(1, 2)) * strict
    rhs = beta[:, :, None] * (V - eG[:, :, None] * (K @ M))
    U = np.linalg.solve(np.eye(C, dtype=V.dtype) + L, rhs)          # (Hv, C, S): the writes delta_t
    O = eG[:, :, None] * (Q @ M) + ((Q @ K.swapaxes(1, 2)) * decay) @ U
    last = np.exp(G[:, -1:] - G).astype(V.dtype)                    # exp(G_last - G_j)
    M *= np.exp(G[:, -1])[:, None, None].astype(V.dtype)
    M += (K * last[:, :, None]).swapaxes(1, 2) @ U
    return O.astype(V.dtype, copy=False)
