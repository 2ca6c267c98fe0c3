"""The rotation of q and k in front of a quantized K cache: an orthonormal (block-diagonal) Walsh-Hadamard
transform over each head's vector, in float32, bit for bit the CUDA kernels' (native/cuda/kv_rotate.cuh).

Why: Qwen2-family models carry a few channels in K far larger than the rest (their k_proj bias), so a 32-value
quantization block's one scale is set by one channel and the small channels around it round to nothing (K q4_0
kept 10% argmax agreement with f16 on Qwen2.5-Coder-1.5B). A Hadamard rotation spreads every channel over all
the values of its block, so no block's scale is set by one channel. Rotating q and k by the same orthonormal H
leaves q . k unchanged (H^T H = I), so attention is the same function up to rounding; V is not rotated.
It spreads a large channel, it does not remove it: where K's large channels are nearly constant across tokens
(Qwen2.5's first layers: the k bias in the slowest RoPE pairs) every rotated value still carries them, and only a
constant per-head key offset (softmax ignores q . c) takes them out: kv_offset.py, subtracted from k before this
rotation (bench/results/2026-11-26-cpu-kv-k-rotation.md).

Rule: K is stored rotated exactly when its type is quantized (q8_0 / q4_0): q and k are rotated after RoPE, k is
quantized in the rotated basis and the attention reads the rotated q. An f16 K is not rotated (bit for bit as
before). Nothing else changes: prefix copies, moves and park/unpark keep the stored (rotated) bytes.

The transform: head_dim = m * B, B = the largest power of two dividing head_dim (head_dim % 32 == 0 for a
quantized type, so B >= 32; 128 for Qwen2.5's 128, 32 for 96). Each of the m blocks of B values gets
H_B / sqrt(B), H_B the Sylvester Hadamard matrix (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]), computed as the
fast transform: stages h = 1, 2, 4, ..., B / 2 in that order, each replacing the pair (x[i], x[i + h]) (bit h of
i clear) with (x[i] + x[i + h], x[i] - x[i + h]), every sum one float32 rounding; then each value times
float32(1 / sqrt(B)) (one rounding). Every output bit depends only on that order, not on which thread computes
it, so the CUDA warp-shuffle version gives the same float32 bits as this one.
"""
from __future__ import annotations

import numpy as np

__all__ = ["rotation_block", "rotation_scale", "rotates_k", "hadamard_rotate", "hadamard_matrix"]


def rotation_block(head_dim: int) -> int:
    """B: the largest power of two dividing head_dim (the block of the block-diagonal Hadamard)."""
    if head_dim <= 0:
        raise ValueError(f"head_dim must be positive, got {head_dim}")
    return head_dim & -head_dim


def rotation_scale(block: int) -> np.float32:
    """float32(1 / sqrt(block)), rounded once from float64 (the kernels use the same constant)."""
    return np.float32(1.0 / np.sqrt(float(block)))


def rotates_k(k_type: str) -> bool:
    """Whether a K cache of this type (backends/kv_types.py name) holds rotated keys: every quantized type."""
    return k_type != "f16"


def hadamard_rotate(x: np.ndarray) -> np.ndarray:
    """x (..., head_dim) float32 -> H x over the last axis, a new float32 array (the fast transform above)."""
    x = np.asarray(x, np.float32)
    d = x.shape[-1]
    block = rotation_block(d)
    y = np.array(x, np.float32).reshape(-1, block)               # rows of one block each
    h = 1
    while h < block:
        y = y.reshape(-1, block // (2 * h), 2, h)                # i = g * 2h + s * h + t, s = bit h of i
        lo, hi = y[:, :, 0, :], y[:, :, 1, :]
        y = np.stack([lo + hi, lo - hi], axis=2)
        h *= 2
    return (y.reshape(x.shape) * rotation_scale(block)).astype(np.float32, copy=False)


def hadamard_matrix(head_dim: int) -> np.ndarray:
    """The rotation as a float64 (head_dim, head_dim) matrix R, hadamard_rotate(x) ~= x @ R.T (tests' oracle)."""
    block = rotation_block(head_dim)
    h = np.ones((1, 1))
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    return np.kron(np.eye(head_dim // block), h / np.sqrt(block))
