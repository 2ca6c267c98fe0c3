"""Brute-force attention over a float16 KV cache in float64: the oracle of the GPU attention tests.

kc, vc: (n_kv_heads, max_ctx, head_dim) float16, as the device stores them; q: (n, n_heads, head_dim)
float32; visible: (n, max_ctx) bool. Returns o (n, n_heads * head_dim) float64; a row that sees no
slot is NaN (the softmax of all -inf), like the reference backend.
"""
import numpy as np


def attention_oracle(q, kc, vc, visible, scale):
    n, n_heads, head_dim = q.shape
    n_kv_heads = kc.shape[0]
    group = n_heads // n_kv_heads
    out = np.empty((n, n_heads, head_dim))
    k64, v64 = kc.astype(np.float64), vc.astype(np.float64)
    for h in range(n_heads):
        kv = h // group
        s = q[:, h].astype(np.float64) @ k64[kv].T * scale            # (n, max_ctx)
        s = np.where(visible, s, -np.inf)
        with np.errstate(invalid="ignore"):
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
        p = np.where(visible, p, 0.0)                                  # never touch hidden slots
        out[:, h] = p @ np.where(np.isfinite(v64[kv]), v64[kv], 0.0)
        out[~visible.any(axis=1), h] = np.nan
    return out.reshape(n, n_heads * head_dim)


def random_cache(rng, n_kv_heads, max_ctx, head_dim, n_written):
    """Slots < n_written hold N(0, 1) values; the rest hold NaN, which a kernel must never read."""
    kc = np.full((n_kv_heads, max_ctx, head_dim), np.nan, np.float16)
    vc = np.full((n_kv_heads, max_ctx, head_dim), np.nan, np.float16)
    kc[:, :n_written] = rng.standard_normal((n_kv_heads, n_written, head_dim))
    vc[:, :n_written] = rng.standard_normal((n_kv_heads, n_written, head_dim))
    return kc, vc


def tree_mask(rng, n):
    """A random tree over n nodes (node 0 the root, parents before children), as DDTree builds:
    mask[i, j] = node j is node i or one of its ancestors."""
    parent = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
    mask = np.zeros((n, n), np.uint8)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = 1
            j = parent[j]
    return mask
