"""The KV window on the reference backend (kv_types.py KVTypes.window): a query at position p reads a quantized
side's row of position t at full precision when t // U == p // U, the stored (quantized) row otherwise.

Oracle: float64 softmax attention where each (query row, key) pair takes the full-precision or the stored key and
value by that rule (the positions of a batch's own rows are batch.positions: a tree's nodes by depth). Tolerance
rtol 1e-4, atol 1e-5, as test_kv_types_cache.py's (float32 arithmetic, the float32 Hadamard rotation). Row invariance
(a chunk's row equals a one-row step at its position) and prefix reuse are checked on a synthetic model: decode vs
full forward within 1e-3 (float32 sums in other orders, and the code flips they cause: see the test), a kept prefix
bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch, KVCacheSpec
from flashd.daemon.backends.kv_rotate import hadamard_matrix, hadamard_rotate, rotates_k
from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
from tests.reference.test_kv_types_cache import random_case, stored
from tests.reference.test_reference_ops import brute_attention

ops = ReferenceOps()
WINDOWED = [KVTypes("q4_0", "q4_0", 64), KVTypes("q4_0", "f16", 64), KVTypes("f16", "q4_0", 128),
            KVTypes("q8_0", "q4_0", 64)]


def window_oracle(q, k_all, v_all, types: KVTypes, k_pos, q_pos, visible):
    """Per query row: brute_attention over keys / values chosen per key by the window rule (float64)."""
    d = q.shape[-1]
    q_seen, k_full = q, k_all
    if rotates_k(types.k):
        k_full = hadamard_rotate(k_all)
        q_seen = q.astype(np.float64) @ hadamard_matrix(d).T
    k_q, v_q = stored(k_full, types.k), stored(v_all, types.v)
    out = []
    for i in range(q.shape[0]):
        near = (k_pos // types.window) == (q_pos[i] // types.window)
        keys = np.where(near[:, None, None], k_full, k_q) if types.windowed("k") else k_q
        values = np.where(near[:, None, None], v_all, v_q) if types.windowed("v") else v_q
        out.append(brute_attention(q_seen[i:i + 1], keys, values, visible[i:i + 1]))
    return np.concatenate(out)


@pytest.mark.parametrize("types", WINDOWED, ids=str)
@pytest.mark.parametrize("n,n_past,heads,kv_heads,d", [(1, 127, 6, 2, 64), (40, 100, 4, 1, 32), (9, 0, 3, 3, 96),
                                                        (70, 250, 8, 2, 128)])
@pytest.mark.parametrize("masked", [False, True])
def test_window_attention_vs_float64(types, n, n_past, heads, kv_heads, d, masked):
    rng, cache, layer, k_past, v_past, q, k, v = random_case(types, n, n_past, heads, kv_heads, d)
    if masked:        # a tree: node i's parent is an earlier node, its position n_past + depth
        parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        depth = [0] * n
        new_visible = np.eye(n, dtype=bool)
        for i in range(1, n):
            depth[i] = depth[parent[i]] + 1
            new_visible[i] = new_visible[parent[i]]
            new_visible[i, i] = True
        positions = n_past + np.asarray(depth, np.int32)
    else:
        new_visible, positions = np.tril(np.ones((n, n), bool)), np.arange(n_past, n_past + n, dtype=np.int32)
    batch = Batch(ids=np.zeros(n, np.int32), positions=positions, n_past=np.array([n_past], np.int32),
                  mask=new_visible if masked else None)
    out = ops.attention(q, k, v, layer, batch)
    k_pos = np.concatenate([np.arange(n_past), positions])
    visible = np.concatenate([np.ones((n, n_past), bool), new_visible], 1)
    want = window_oracle(q, np.concatenate([k_past, k]), np.concatenate([v_past, v]), types, k_pos, positions,
                         visible)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_a_window_over_the_whole_context_is_the_full_precision_cache():
    rng = np.random.default_rng(5)
    n, kv_heads, d = 50, 2, 64
    full = ops.kv_cache(KVCacheSpec(1, 64, kv_heads, d, KVTypes("q4_0", "q4_0", 64)))
    q = rng.standard_normal((n, 4, d)).astype(np.float32)
    k = rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    v = rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    batch = Batch(ids=np.zeros(n, np.int32), positions=np.arange(n, dtype=np.int32), n_past=np.array([0], np.int32))
    out = ops.attention(q, k, v, full.layer(0), batch)
    want = brute_attention(q.astype(np.float64) @ hadamard_matrix(d).T, hadamard_rotate(k), v,
                           np.tril(np.ones((n, n), bool)))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_moves_carry_the_full_precision_copies_and_sizes_count_them():
    spec = KVCacheSpec(2, 16, 1, 32, KVTypes("q4_0", "f16", 64))
    cache = ops.kv_cache(spec)
    rows = np.arange(16 * 32, dtype=np.float32).reshape(16, 1, 32)
    cache.layer(1)[0][0:16] = rows
    cache.move(np.array([9, 12]), np.array([3, 4]))
    np.testing.assert_array_equal(cache.k_full[1, [3, 4]], rows[[9, 12]])
    assert cache.v_full is None and cache.n_bytes == cache.k.nbytes + cache.v.nbytes + cache.k_full.nbytes


def test_kv_types_check_the_window():
    assert str(KVTypes("q4_0", "q4_0", 256)) == "q4_0,window=256"
    assert KVTypes("q4_0", "f16", 64).as_dict() == {"k": "q4_0", "v": "f16", "window": 64}
    assert KVTypes("q4_0", "f16", 64).windowed("k") and not KVTypes("q4_0", "f16", 64).windowed("v")
    for bad in (-64, 32, 100, 64.0):
        with pytest.raises(ValueError, match="window"):
            KVTypes("q4_0", "q4_0", bad)
    with pytest.raises(ValueError, match="quantized"):
        KVTypes("f16", "f16", 64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    spec = SyntheticSpec(arch="qwen2", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=300,
                         seed=43, name="kvw")                  # head_dim 32
    path = write_synthetic_model(tmp_path_factory.mktemp("kvw") / "kvw.gguf", spec)
    return load_model(path, ops.load_weight)


@pytest.mark.parametrize("types", WINDOWED[:2], ids=str)
def test_runner_rows_are_per_position_and_prefix_reuse_is_exact(tiny, types):
    """One-row steps give the full forward's logits across window blocks (each row reads by its own position);
    a prompt keeping a cached prefix (whole chunks: multiples of the window) gives an empty cache's logits bit
    for bit. The chunk must be a multiple of the window."""
    lm = tiny
    ids = [int(t) for t in np.random.default_rng(11).integers(0, 300, 150)]
    r = ModelRunner(ops, lm.config, lm.weights, 256, 64, types)
    full = r.score(ids)
    r.reset()
    r.prefill(ids[:60])
    step = np.concatenate([r.prefill([t], all_logits=True) for t in ids[60:140]])   # crosses position 64 and 128
    # 1e-3 of logits up to ~8: the window passes float32 noise (the chunks' sums in other orders) into the next
    # layer's keys unrounded, where it can flip a q4_0 code on its rounding edge for a later block (measured 1.4e-4;
    # float16 or q4_0 alone: 4e-6)
    np.testing.assert_allclose(step, full[60:140], rtol=1e-4, atol=1e-3)
    fresh = ModelRunner(ops, lm.config, lm.weights, 256, 64, types)
    fresh.reuse_prefix = False
    want = fresh.start(ids[:100] + [7, 8, 9])
    r.reset()
    r.start(ids)
    got = r.start(ids[:100] + [7, 8, 9])
    assert r.n_reused == 64
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="multiple of the KV window"):
        ModelRunner(ops, lm.config, lm.weights, 256, 96, types)
