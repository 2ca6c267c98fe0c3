"""A q4_0 encoder with a searched scale for a quantized K (the same 18-byte block format as kv_quant.py, so every
reader is unchanged; only the writer picks other codes).

Why: ggml's q4_0 sets d = max / -8 from the block's largest value, which is the least-squares choice only when
that value is far from the rest. After the Hadamard rotation (kv_rotate.py) a K block is close to Gaussian, and a
slightly smaller or larger step fits the other 31 values better. Trying SCALE_FACTORS and keeping the d with the
least squared error lowered the read-back error ~10% on Gaussian blocks and the mean KL(f16 || q4_0 K) of
Qwen2.5-Coder-1.5B by 17% over 1024 tokens of code with 34 candidates (bench/lab/kv_k4_variants.py, 2026-11-26 session 13). It is
not enough on its own for issue 16's q4_0 bar (see bench/NOTES.md, session 13).

The arithmetic (float32, one rounding per operation, so a CUDA warp can repeat it bit for bit): per block x (32
values), mx = the first value of largest magnitude (ggml's). For candidate i: d = mx * S[i] (S[i] = float32(-F[i] /
8); S[0] = -0.125, so candidate 0 is ggml's d = mx / -8 exactly), id = d ? 1 / d : 0, q = min(15, max(0,
trunc(x * id + 8.5))) (ggml's rounding; the max only matters for F < 1), dh = float16(d), err = the sum over the
block of (dh * (q - 8) - x)^2, summed as a warp's xor butterfly (stages 16, 8, 4, 2, 1: s[j] += s[j ^ h]). The
candidate of least err wins, the lowest index on a tie, so the result is never worse than ggml's in squared error.
"""
from __future__ import annotations

import numpy as np

from .kv_quant import encode_rows
from .kv_types import QUANT_BLOCK, row_bytes

__all__ = ["SCALE_FACTORS", "scale_multipliers", "quantize_q4_0_searched", "butterfly_sum", "encode_k_rows"]

# F: step factors tried, in this order (a greedy choice on Gaussian blocks: each adds the most to the ones before)
SCALE_FACTORS = (1.0, 0.95, 1.1, 0.925, 1.025, 0.975, 1.15, 0.9)


def scale_multipliers() -> np.ndarray:
    """S[i] = float32(-F[i] / 8), rounded once from float64 (the kernels hold the same constants)."""
    return np.array([-f / 8.0 for f in SCALE_FACTORS], np.float64).astype(np.float32)


def butterfly_sum(v: np.ndarray) -> np.ndarray:
    """(..., 32) float32 -> (...,) the sum in a warp's xor-butterfly order (every lane ends with these bits)."""
    s = np.array(v, np.float32)
    lanes = np.arange(QUANT_BLOCK)
    h = QUANT_BLOCK // 2
    while h:
        s = (s + s[..., lanes ^ h]).astype(np.float32)
        h //= 2
    return s[..., 0]


def _codes(b: np.ndarray, d: np.ndarray) -> np.ndarray:
    """b (n, 32), d (n, 1) float32 -> codes (n, 32) float32 in 0..15 (ggml's id = 1 / d and truncation)."""
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    t = (b * inv).astype(np.float32) + np.float32(8.5)
    return np.minimum(np.maximum(np.trunc(t), np.float32(0.0)), np.float32(15.0))


def quantize_q4_0_searched(x: np.ndarray) -> np.ndarray:
    """(n_blocks * 32,) or (..., 32k) float32 -> (n_blocks, 18) bytes, kv_types.py's q4_0 layout (see above)."""
    b = np.ascontiguousarray(x, np.float32).reshape(-1, QUANT_BLOCK)
    first = np.abs(b).argmax(axis=1)[:, None]                    # ggml: strict '<', the first one wins
    mx = np.take_along_axis(b, first, axis=1)
    best_q = best_d = best_err = None
    for s in scale_multipliers():
        d = (mx * s).astype(np.float32)
        q = _codes(b, d)
        dh = d.astype(np.float16)
        diff = (dh.astype(np.float32) * (q - np.float32(8.0))).astype(np.float32) - b
        err = butterfly_sum((diff * diff).astype(np.float32))
        if best_err is None:
            best_q, best_d, best_err = q, dh, err
            continue
        take = err < best_err                                    # strict: the earlier candidate keeps a tie
        best_q[take], best_d[take], best_err[take] = q[take], dh[take], err[take]
    q = best_q.astype(np.uint8)
    packed = q[:, :QUANT_BLOCK // 2] | (q[:, QUANT_BLOCK // 2:] << np.uint8(4))
    return np.concatenate([best_d.view(np.uint8).reshape(-1, 2), packed], axis=1)


def encode_k_rows(x: np.ndarray, kv_type: str) -> np.ndarray:
    """A K cache's encoder: x (..., head_dim) float32 -> (..., row_bytes) uint8; q4_0 with the searched scale, q8_0
    ggml's (kv_quant.encode_rows). The CUDA K writers do the same (native/cuda/kv_quant_search.cuh)."""
    if kv_type != "q4_0":
        return encode_rows(x, kv_type)
    return quantize_q4_0_searched(x).reshape(*x.shape[:-1], row_bytes(kv_type, x.shape[-1]))
