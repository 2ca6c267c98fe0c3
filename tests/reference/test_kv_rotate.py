"""The Hadamard rotation of q and k in front of a quantized K cache (daemon/backends/kv_rotate.py; the CUDA
kernels' native/cuda/kv_rotate.cuh is the same arithmetic, checked bit for bit against it in
tests/gpu/test_kv_quant_write.py).

Against float64: the matrix is orthonormal (R R^T = I to 1e-12) and block-diagonal with the largest power-of-two
block; the float32 fast transform equals x @ R^T within its rounding (log2(B) sums plus one product per value,
each within 2^-24 relative of values bounded by sqrt(B) |x|max: atol 1e-6 * |x|max * sqrt(B) is several times
that); q . k is preserved (float64 exactly to 1e-12, float32 within the same bound). Reference attention over a
quantized K with outlier channels: the rotated keys' quantization error is a fraction of the unrotated ones'
(the bytes a K-unrotated cache would hold), and the attention is closer to the unquantized one."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch, KVCacheSpec
from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_rotate import (hadamard_matrix, hadamard_rotate, rotates_k, rotation_block,
                                              rotation_scale)
from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.backends.reference import ReferenceOps
from tests.reference.test_reference_ops import brute_attention

HEAD_DIMS = [32, 64, 96, 128, 160, 192, 256, 512]


def test_block_and_scale():
    assert [rotation_block(d) for d in HEAD_DIMS] == [32, 64, 32, 128, 32, 64, 256, 512]
    assert rotation_scale(64) == np.float32(0.125) and rotation_scale(128) == np.float32(1 / np.sqrt(128.0))
    assert rotates_k("q8_0") and rotates_k("q4_0") and not rotates_k("f16")


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_matrix_is_orthonormal_block_diagonal_hadamard(d):
    r = hadamard_matrix(d)
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-12)
    b = rotation_block(d)
    assert np.allclose(np.abs(r[:b, :b]), 1 / np.sqrt(b))              # every entry +-1/sqrt(B) in a block
    off = r.copy()
    for i in range(0, d, b):
        off[i:i + b, i:i + b] = 0
    assert not off.any()


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_fast_transform_vs_float64_and_dot_products_preserved(d):
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((7, 3, d)) * 5).astype(np.float32)
    x[..., 3] *= 40                                                     # an outlier channel, as Qwen2's K
    r = hadamard_matrix(d)
    got = hadamard_rotate(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    bound = 1e-6 * np.abs(x).max() * np.sqrt(rotation_block(d))
    np.testing.assert_allclose(got, x.astype(np.float64) @ r.T, rtol=0, atol=bound)
    q, k = x[0], x[1]
    exact = np.einsum("hd,hd->h", q.astype(np.float64), k.astype(np.float64))
    np.testing.assert_allclose(np.einsum("hd,hd->h", q @ r.T, k @ r.T), exact, rtol=1e-12, atol=1e-9)
    rotated = np.einsum("hd,hd->h", hadamard_rotate(q).astype(np.float64), hadamard_rotate(k).astype(np.float64))
    np.testing.assert_allclose(rotated, exact, rtol=0, atol=4 * bound * np.abs(x).max() * np.sqrt(d))
    # one channel alone is spread evenly over its block: every value +-c / sqrt(B), the rest of the row 0
    b = rotation_block(d)
    one = np.zeros(d, np.float32)
    one[b + 3 if d > b else 3] = 64.0
    spread = hadamard_rotate(one)
    blk = slice(b, 2 * b) if d > b else slice(0, b)
    np.testing.assert_allclose(np.abs(spread[blk]), 64.0 / np.sqrt(b), rtol=1e-6)
    assert np.count_nonzero(spread) == b
    np.testing.assert_array_equal(hadamard_rotate(np.zeros((2, d), np.float32)), np.zeros((2, d), np.float32))


def test_the_stage_order_is_the_kernels():
    """Stages h = 1, 2, ..., B/2 then one product: the same float32 bits as an explicit loop written the kernels'
    way (pairs (i, i ^ h), lower index gets the sum)."""
    x = np.random.default_rng(1).standard_normal((5, 96)).astype(np.float32) * 3
    want = x.copy()
    b = rotation_block(96)
    h = 1
    while h < b:
        nxt = want.copy()
        for i in range(96):
            j = i ^ h
            nxt[:, i] = want[:, i] + want[:, j] if i & h == 0 else want[:, j] - want[:, i]
        want, h = nxt, 2 * h
    np.testing.assert_array_equal(hadamard_rotate(x), want * rotation_scale(b))


def outlier_keys(rng, n, kv_heads, d):
    """Keys like Qwen2's: N(0, 1) channels plus two channels ~60x larger (fixed per head)."""
    k = rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    k[..., 5] = 60 + rng.standard_normal((n, kv_heads))
    k[..., 70 % d] = -45 + rng.standard_normal((n, kv_heads))
    return k


@pytest.mark.parametrize("k_type", ["q8_0", "q4_0"])
def test_reference_attention_over_rotated_quantized_k(k_type):
    """ReferenceOps.attention over a quantized K: bit for bit the float64 oracle's inputs (rotated keys' bytes)
    and close to it (rtol 1e-4, atol 1e-5 as test_kv_types_cache.py); and far closer to the unquantized
    attention than the unrotated bytes would be."""
    rng = np.random.default_rng(7)
    n, heads, kv_heads, d = 24, 4, 2, 128
    ops = ReferenceOps()
    cache = ops.kv_cache(KVCacheSpec(1, n + 2, kv_heads, d, KVTypes(k_type, "f16")))
    layer = cache.layer(0)
    q = (rng.standard_normal((n, heads, d)) * 0.3).astype(np.float32)
    q[..., 5] *= 0.2
    k, v = outlier_keys(rng, n, kv_heads, d), rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    batch = Batch(ids=np.zeros(n, np.int32), positions=np.arange(n, dtype=np.int32), n_past=np.array([0], np.int32))
    out = ops.attention(q, k, v, layer, batch)
    blocks = encode_rows(hadamard_rotate(k), k_type)
    np.testing.assert_array_equal(cache.k[0, :n], blocks)                 # rotated keys, ggml's rounding
    visible = np.tril(np.ones((n, n), bool))
    r = hadamard_matrix(d)
    oracle = brute_attention(q.astype(np.float64) @ r.T, decode_rows(blocks, k_type), v, visible)
    np.testing.assert_allclose(out, oracle, rtol=1e-4, atol=1e-5)
    # the keys' quantization error (squared, summed over a head: R is orthonormal, so it is the same in either
    # basis, and any q's score error is q . err) is well below the unrotated keys' (this data: q8_0 0.09 vs
    # 0.87, q4_0 23 vs 62 per row), and so is the attention's distance from the unquantized K's
    rot = hadamard_rotate(k)
    err_rot = ((decode_rows(blocks, k_type) - rot.astype(np.float64)) ** 2).sum(-1).mean()
    err_plain = ((decode_rows(encode_rows(k, k_type), k_type) - k.astype(np.float64)) ** 2).sum(-1).mean()
    assert err_rot < err_plain / 2, (err_rot, err_plain)
    exact = brute_attention(q, k, v, visible)
    unrotated = brute_attention(q, decode_rows(encode_rows(k, k_type), k_type), v, visible)
    assert np.abs(out - exact).max() < np.abs(unrotated - exact).max()


def test_kv_write_tail_probs_and_an_f16_k_are_consistent():
    """kv_write rotates k for a quantized K (so a later attention meets the same rows); an f16 K stores k as is;
    tail_max_probs rotates q alike (its probabilities equal the unquantized ones within the quantization)."""
    rng = np.random.default_rng(3)
    ops = ReferenceOps()
    k = outlier_keys(rng, 8, 2, 64)
    v = rng.standard_normal((8, 2, 64)).astype(np.float32)
    for k_type in ("f16", "q8_0"):
        cache = ops.kv_cache(KVCacheSpec(1, 8, 2, 64, KVTypes(k_type, "q4_0")))
        ops.kv_write(k, v, cache.layer(0), np.array([0], np.int32))
        want = k if k_type == "f16" else encode_rows(hadamard_rotate(k), k_type)
        np.testing.assert_array_equal(cache.k[0], want)
        q = rng.standard_normal((8, 4, 64)).astype(np.float32) * 0.05
        acc = np.zeros((4, 8), np.float32)
        ops.tail_max_probs(q, cache.layer(0), 8, 4, acc)
        plain = np.zeros((4, 8), np.float32)
        ReferenceOps().tail_max_probs(q, (k, v), 8, 4, plain)
        np.testing.assert_allclose(acc, plain, atol=2e-2)
