"""The quantized KV row formats in numpy: ggml's reference encoders, bit for bit, and their decoders.

The encoders repeat ggml-quants.c's quantize_row_q8_0_ref / quantize_row_q4_0_ref in float32, one
operation at a time, so the codes and the float16 scales are exactly ggml's (tests/reference/
test_kv_quant.py checks them against gguf.quants, which reproduces ggml bit for bit). The CUDA write
kernels repeat the same operations; this module is their oracle.

Shapes: x (..., head_dim) float32 with head_dim % 32 == 0 -> rows (..., row_bytes) uint8 (kv_types.py's
layout), and back.
"""
from __future__ import annotations

import numpy as np

from .kv_types import BLOCK_BYTES, QUANT_BLOCK, row_bytes

__all__ = ["encode_rows", "decode_rows", "quantize_q8_0", "quantize_q4_0", "dequantize_q8_0", "dequantize_q4_0"]


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.shape[-1] % QUANT_BLOCK:
        raise ValueError(f"rows of {x.shape[-1]} values are not whole blocks of {QUANT_BLOCK}")
    return x.reshape(-1, QUANT_BLOCK)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf (half away from zero) of float32 values, exactly: |x| + 0.5 is exact in float64."""
    a = np.abs(x.astype(np.float64))
    return (np.sign(x) * np.floor(a + 0.5)).astype(np.float32)


def _inverse(d: np.ndarray) -> np.ndarray:
    """id = d ? 1.0f / d : 0.0f, in float32."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """(n_blocks * 32,) values -> (n_blocks, 34) bytes: d = amax / 127, q = roundf(x * (1 / d)), d as float16."""
    b = _blocks(x)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127.0)).astype(np.float32)
    q = _roundf(b * _inverse(d)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """-> (n_blocks, 18) bytes: max = the first value of largest magnitude, d = max / -8,
    q = min(15, (int)(x * (1 / d) + 8.5f)) (truncation), d as float16; byte j = q[j] | q[j + 16] << 4."""
    b = _blocks(x)
    first = np.abs(b).argmax(axis=1)[:, None]                     # ggml: strict '<', the first one wins
    d = (np.take_along_axis(b, first, axis=1) / np.float32(-8.0)).astype(np.float32)
    t = (b * _inverse(d)).astype(np.float32) + np.float32(8.5)
    q = np.minimum(np.trunc(t), np.float32(15.0)).astype(np.uint8)
    packed = q[:, :QUANT_BLOCK // 2] | (q[:, QUANT_BLOCK // 2:] << np.uint8(4))
    return np.concatenate([d.astype(np.float16).view(np.uint8), packed], axis=1)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """(n_blocks, 34) -> (n_blocks, 32) float32: d * q."""
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    return d * blocks[:, 2:].view(np.int8).astype(np.float32)


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """(n_blocks, 18) -> (n_blocks, 32) float32: d * (q - 8)."""
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    nib = blocks[:, 2:]
    q = np.concatenate([nib & np.uint8(0x0F), nib >> np.uint8(4)], axis=1).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


_ENCODE = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}
_DECODE = {"q8_0": dequantize_q8_0, "q4_0": dequantize_q4_0}


def encode_rows(x: np.ndarray, kv_type: str) -> np.ndarray:
    """x (..., head_dim) float32 -> (..., row_bytes) uint8 in kv_type (q8_0 or q4_0)."""
    head_dim = x.shape[-1]
    return _ENCODE[kv_type](x).reshape(*x.shape[:-1], row_bytes(kv_type, head_dim))


def decode_rows(rows: np.ndarray, kv_type: str) -> np.ndarray:
    """rows (..., row_bytes) uint8 -> (..., head_dim) float32."""
    per = BLOCK_BYTES[kv_type]
    n_values = rows.shape[-1] // per * QUANT_BLOCK
    blocks = np.ascontiguousarray(rows).reshape(-1, per)
    return _DECODE[kv_type](blocks).reshape(*rows.shape[:-1], n_values)
