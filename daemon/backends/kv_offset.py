"""The key offset of a quantized K cache: a constant vector c per (layer, KV head) subtracted from every key after
RoPE and before the Hadamard rotation and the encode (kv_rotate.py says why the rotation alone is not enough).

Why it is free: a query's scores over the keys k_t become q . (k_t - c) = q . k_t - q . c, the same shift for every
key of that head, so the softmax -- and the attention output -- is exactly the same function; q is not changed. Why
it helps: in Qwen2.5's first layers K has channels of 150-360 that barely change across tokens (the k bias in the
slowest RoPE pairs); with them in, a 32-value block's scale (after the rotation: every block's) is set by them and
q4_0's 16 levels leave the rest at nothing. Taking c out first brought K q4_0 from 6% to 97% argmax agreement with
the f16 cache on Qwen2.5-Coder-1.5B over 1024 tokens (bench/results/2026-11-26-cpu-kv-k-rotation.md).

c: the mean over positions [0, OFFSET_POSITIONS) of RoPE(k bias) per head -- for a rotating pair (a, b) with mean
cos C and mean sin S over those positions, (a C - b S, a S + b C): a slowly turning pair keeps nearly all of its
bias, a fast one nearly none; dims past rope_dim keep the whole bias (they do not turn). Formed in float64 from the
reference's float32 cos/sin (ReferenceOps.rope_cos_sin), rounded to float32 once; both backends subtract the same
float32 c (one float32 subtraction per value). A function of the model only (not of max_ctx): a prefix saved by one
runner is reused by another, and every key of a cache must have had the same c taken out. None -- no offset --
for a model without a k bias or with a per-head K norm (qwen3: the bias is not a constant there), and for an f16 K
(never rotated, never offset: bit for bit as before).
"""
from __future__ import annotations

import numpy as np

__all__ = ["OFFSET_POSITIONS", "cache_key_offsets", "key_offset", "model_key_offsets"]

OFFSET_POSITIONS = 4096       # positions averaged over (the measured prototype's)


def key_offset(k_bias, n_kv_heads: int, head_dim: int, theta: float, rope_dim: int, neox: bool,
               scaling=None, n_positions: int = OFFSET_POSITIONS) -> np.ndarray:
    """(n_kv_heads, head_dim) float32: the mean of RoPE(k_bias) over positions [0, n_positions), per head."""
    from .reference import ReferenceOps
    b = np.asarray(k_bias, np.float64).reshape(n_kv_heads, head_dim)
    cos, sin = ReferenceOps.rope_cos_sin(np.arange(n_positions, dtype=np.int64), theta, rope_dim, scaling)
    c, s = cos.astype(np.float64).mean(axis=0), sin.astype(np.float64).mean(axis=0)    # (rope_dim / 2,)
    half = rope_dim // 2
    out = b.copy()
    if neox:
        ia, ib = np.arange(half), np.arange(half) + half
    else:
        ia, ib = np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)
    out[:, ia] = b[:, ia] * c - b[:, ib] * s
    out[:, ib] = b[:, ia] * s + b[:, ib] * c
    return out.astype(np.float32)


def model_key_offsets(ops, cfg, weights) -> np.ndarray | None:
    """(n_layers, n_kv_heads, head_dim) float32 key offsets of a dense model's layers, or None (see above)."""
    layers = getattr(weights, "layers", None)
    if cfg.linear is not None or cfg.qk_norm or not layers or any(w.attn_k_bias is None for w in layers):
        return None
    return np.stack([key_offset(np.asarray(ops.to_numpy(w.attn_k_bias), np.float32), cfg.n_kv_heads, cfg.head_dim,
                                cfg.rope_theta, cfg.rope_dim, cfg.rope_neox, cfg.rope_scaling) for w in layers])


def cache_key_offsets(spec, offsets) -> np.ndarray | None:
    """What a KV cache (reference or CUDA) keeps of `offsets`, every layer's key offset (n_layers, Hkv, d) float32
    (model_key_offsets) or None: None unless the K cache is quantized (only a rotated K keeps one), else the checked,
    contiguous array. ValueError on another shape or dtype."""
    from .kv_rotate import rotates_k
    if offsets is None or not rotates_k(spec.kv_types.k):
        return None
    offsets = np.asarray(offsets)
    want = (spec.n_layers, spec.n_kv_heads, spec.head_dim)
    if offsets.shape != want or offsets.dtype != np.float32:
        raise ValueError(f"key offsets {offsets.shape} {offsets.dtype}, want {want} float32")
    return np.ascontiguousarray(offsets)
