"""The device layout of a quantized KV cache layer (native/include/flashd_attention.h, FD_KV_Q8_0 / FD_KV_Q4_0)
and ggml's block layout (backends/kv_quant.py), converted both ways on the host.

One layer's K (or V) of n_kv_heads * max_ctx rows is two planes: the codes of every row (q8_0: head_dim int8;
q4_0: head_dim / 2 bytes, block b's 16 bytes in order), then the float16 scales of every row (head_dim / 32 each).
ggml's blocks put each block's 2 scale bytes before its codes. Same bytes, regrouped.
"""
from __future__ import annotations

import numpy as np

from ..kv_types import BLOCK_BYTES, QUANT_BLOCK

__all__ = ["planes_from_blocks", "blocks_from_planes"]


def planes_from_blocks(blocks: np.ndarray, kind: str) -> np.ndarray:
    """blocks (n_kv_heads, max_ctx, row_bytes) uint8 in ggml's layout -> the device plane bytes (flat uint8)."""
    per = BLOCK_BYTES[kind]
    n_kv_heads, max_ctx, row = blocks.shape
    b = blocks.reshape(n_kv_heads * max_ctx, row // per, per)
    return np.concatenate([b[..., 2:].reshape(-1), b[..., :2].reshape(-1)])


def blocks_from_planes(raw: np.ndarray, kind: str, n_kv_heads: int, max_ctx: int, head_dim: int) -> np.ndarray:
    """The device plane bytes -> (n_kv_heads, max_ctx, row_bytes) uint8 in ggml's block layout."""
    nb, per = head_dim // QUANT_BLOCK, BLOCK_BYTES[kind] - 2      # blocks per row, code bytes per block
    rows = n_kv_heads * max_ctx
    raw = np.asarray(raw, np.uint8).reshape(-1)
    if raw.size != rows * nb * (per + 2):
        raise ValueError(f"{raw.size} bytes are not a {kind} plane of {rows} rows of {head_dim} values")
    codes = raw[:rows * nb * per].reshape(rows, nb, per)
    scales = raw[rows * nb * per:].reshape(rows, nb, 2)
    return np.concatenate([scales, codes], axis=2).reshape(n_kv_heads, max_ctx, nb * (per + 2))
