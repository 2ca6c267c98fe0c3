"""K-quant encoders: gguf 0.19 can dequantize Q4_K/Q5_K/Q6_K but not quantize them.

Simple, exact-range quantizers, not llama.cpp's error-minimising search: the scales are rounded
*up* onto their grids so no value is ever clipped, and every value is rounded to its nearest
level, so |dequant - x| <= half a quantization step of its sub-block.
"""
from __future__ import annotations

from collections.abc import Callable

import gguf
import numpy as np

__all__ = ["OWN_QUANTIZERS", "quantize_q4_k", "quantize_q5_k", "quantize_q6_k"]

QK_K = 256


def _f16_round_up(x: np.ndarray) -> np.ndarray:
    """The smallest float16 >= x (x >= 0, finite), as float32."""
    h = x.astype(np.float16)
    if not np.all(np.isfinite(h)):
        raise ValueError("weights too large for a float16 block scale")
    low = h.astype(np.float32) < x
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h.astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), 0).astype(np.float32)


def _affine_k_scales(x: np.ndarray, n_levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scales of the Q4_K/Q5_K form y = d*sc[j]*q - dmin*m[j], q in [0, n_levels), sc, m in [0, 63].

    x: (n_blocks, 8, 32). Returns d, dmin (n_blocks,) f16-exact float32, sc, m (n_blocks, 8) uint8
    and q (n_blocks, 8, 32) uint8.
    """
    sub_min = np.minimum(x.min(axis=-1), 0.0)                     # (n, 8), <= 0 as in ggml
    sub_max = x.max(axis=-1)
    dmin = _f16_round_up(np.max(-sub_min, axis=-1) / 63)          # (n,)
    m = np.ceil(_safe_div(-sub_min, dmin[:, None])).clip(0, 63)    # offset dmin*m <= sub_min: covers
    offset = dmin[:, None] * m                                     # (n, 8), >= -sub_min
    need = (sub_max + offset) / (n_levels - 1)                     # step that reaches sub_max
    d = _f16_round_up(np.max(need, axis=-1) / 63)
    sc = np.ceil(_safe_div(need, d[:, None])).clip(0, 63)
    step = d[:, None] * sc
    q = np.rint(_safe_div(x + offset[..., None], np.broadcast_to(step[..., None], x.shape)))
    q = q.clip(0, n_levels - 1)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """ggml's 12-byte packing of eight 6-bit scales and mins (inverse of Q4_K.get_scale_min)."""
    lo_sc, hi_sc = sc[:, :4], sc[:, 4:]
    lo_m, hi_m = m[:, :4], m[:, 4:]
    b0 = (lo_sc & 0x3F) | ((hi_sc >> 4) << 6)
    b1 = (lo_m & 0x3F) | ((hi_m >> 4) << 6)
    b2 = (hi_sc & 0x0F) | ((hi_m & 0x0F) << 4)
    return np.concatenate([b0, b1, b2], axis=-1).astype(np.uint8)


def _pack_nibbles_k(q_low: np.ndarray) -> np.ndarray:
    """Low 4 bits of (n, 8, 32) values: byte c*32+i holds sub-block 2c (low) and 2c+1 (high)."""
    q_low = (q_low & 0x0F).reshape(-1, 4, 2, 32)
    return (q_low[:, :, 0, :] | (q_low[:, :, 1, :] << 4)).reshape(-1, 128)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 144) uint8: d f16, dmin f16, scales[12], qs[128]."""
    d, dmin, sc, m, q = _affine_k_scales(blocks.reshape(-1, 8, 32), 16)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), _pack_nibbles_k(q)], axis=-1)


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 176) uint8: d, dmin, scales[12], qh[32] (bit j = sub-block j), qs[128]."""
    d, dmin, sc, m, q = _affine_k_scales(blocks.reshape(-1, 8, 32), 32)
    high = (q >> 4) & 1                                             # (n, 8, 32)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= high[:, j, :] << j
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, m), qh, _pack_nibbles_k(q)], axis=-1)


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) float32 -> (n, 210) uint8: ql[128], qh[64], scales int8[16], d f16.

    y = d * scales[s] * (q - 32), q in [0, 64), sub-blocks s of 16 values.
    """
    x = blocks.reshape(-1, 16, 16)
    # Step that keeps the sub-block inside [-32, 31] levels (negative side reaches -32).
    need = np.maximum(np.maximum(-x.min(axis=-1), 0) / 32, np.maximum(x.max(axis=-1), 0) / 31)  # (n, 16)
    d = _f16_round_up(np.max(need, axis=-1) / 127)
    sc = np.ceil(_safe_div(need, d[:, None])).clip(0, 127)
    step = d[:, None] * sc
    q = np.rint(_safe_div(x, np.broadcast_to(step[..., None], x.shape))).clip(-32, 31)
    q = (q + 32).astype(np.uint8).reshape(-1, 2, 128)               # halves of 128 values
    low = q & 0x0F
    high = q >> 4
    # ql[h*64 + b]: low nibble = value h*128+b, high nibble = value h*128+64+b
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(-1, 128)
    # qh[h*32 + b] bits 2k..2k+1 = high bits of value h*128 + 32k + b
    high = high.reshape(-1, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql, qh, scales, _f16_bytes(d)], axis=-1)


OWN_QUANTIZERS: dict[gguf.GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    gguf.GGMLQuantizationType.Q4_K: quantize_q4_k,
    gguf.GGMLQuantizationType.Q5_K: quantize_q5_k,
    gguf.GGMLQuantizationType.Q6_K: quantize_q6_k,
}
