"""The reference backend over every KV cache type (--kv-type f16|q8_0|q4_0, K and V separately).

Attention: ReferenceOps.attention writes K/V into a quantized cache and attends the dequantized rows; the oracle
is float64 softmax attention over decode(encode(K/V)) (kv_quant.py, itself checked bit for bit against
gguf.quants in test_kv_quant.py); a quantized K stores the Hadamard-rotated keys (kv_rotate.py, checked against
float64 in test_kv_rotate.py), so there the oracle's q is rotated by the float64 matrix and its keys are
decode(encode(rotated k)). Tolerance rtol 1e-4, atol 1e-5: the reference computes in float32, the same bound as
the float32 cache's test (test_reference_ops.py); the float32 rotation adds a few float32 roundings per value. Prefix copies, moves (kv_compact) and
park/unpark keep the stored bytes: exact equality.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch, KVCacheSpec
from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_rotate import hadamard_matrix, hadamard_rotate, rotates_k
from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.models import ModelLoadError, load_model
from flashd.daemon.runner import ModelRunner
from flashd.protocol import messages as m
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
from tests.daemon.engine_client import EngineClient
from tests.reference.test_reference_ops import brute_attention

ops = ReferenceOps()
TYPES = [KVTypes("f16", "f16"), KVTypes("q8_0", "q8_0"), KVTypes("q4_0", "q4_0"), KVTypes("q8_0", "q4_0"),
         KVTypes("f16", "q4_0")]


def stored(x: np.ndarray, kv_type: str) -> np.ndarray:
    """What a cache of kv_type gives back for rows x: float32 x itself for f16, else the decoded blocks."""
    return x if kv_type == "f16" else decode_rows(encode_rows(x, kv_type), kv_type)


def batch(n: int, n_past: int, mask=None) -> Batch:
    return Batch(ids=np.zeros(n, np.int32), positions=np.arange(n_past, n_past + n, dtype=np.int32),
                 n_past=np.array([n_past], np.int32), mask=mask)


def random_case(types: KVTypes, n: int, n_past: int, heads: int, kv_heads: int, d: int):
    """A one-layer cache of `types` holding n_past random K/V rows, and n new rows' q, k, v (float32; K scaled by 3):
    (rng, cache, layer, k_past, v_past, q, k, v), seeded by the shape."""
    rng = np.random.default_rng(n * 1000 + n_past + d)
    cache = ops.kv_cache(KVCacheSpec(1, n_past + n + 3, kv_heads, d, types))
    layer = cache.layer(0)
    k_past = (rng.standard_normal((n_past, kv_heads, d)) * 3).astype(np.float32)
    v_past = rng.standard_normal((n_past, kv_heads, d)).astype(np.float32)
    if n_past:
        ops.kv_write(k_past, v_past, layer, np.array([0], np.int32))
    q = rng.standard_normal((n, heads, d)).astype(np.float32)
    k = (rng.standard_normal((n, kv_heads, d)) * 3).astype(np.float32)
    v = rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    return rng, cache, layer, k_past, v_past, q, k, v


@pytest.mark.parametrize("types", TYPES, ids=str)
@pytest.mark.parametrize("n,n_past,heads,kv_heads,d", [(1, 37, 6, 2, 64), (7, 13, 4, 1, 32), (5, 0, 3, 3, 96),
                                                        (13, 29, 8, 2, 128)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_over_each_kv_type_vs_float64(types, n, n_past, heads, kv_heads, d, masked):
    rng, cache, layer, k_past, v_past, q, k, v = random_case(types, n, n_past, heads, kv_heads, d)
    new_visible = np.tril(rng.random((n, n)) < 0.5) | np.eye(n, dtype=bool) if masked else np.tril(np.ones((n, n), bool))
    out = ops.attention(q, k, v, layer, batch(n, n_past, new_visible if masked else None))
    k_all = np.concatenate([k_past, k])
    q_seen = q
    if rotates_k(types.k):                            # rotated keys: q meets them rotated (float64 oracle)
        k_all, k = hadamard_rotate(k_all), hadamard_rotate(k)
        q_seen = q.astype(np.float64) @ hadamard_matrix(d).T
    keys = stored(k_all, types.k)
    values = stored(np.concatenate([v_past, v]), types.v)
    visible = np.concatenate([np.ones((n, n_past), bool), new_visible], 1)
    np.testing.assert_allclose(out, brute_attention(q_seen, keys, values, visible), rtol=1e-4, atol=1e-5)
    for kind, store, x in ((types.k, cache.k, k), (types.v, cache.v, v)):   # the bytes ggml would store
        want = x if kind == "f16" else encode_rows(x, kind)
        np.testing.assert_array_equal(store[0, n_past:n_past + n], want)


@pytest.mark.parametrize("types", TYPES, ids=str)
def test_prefix_copy_move_and_sizes_keep_the_bytes(types):
    rng = np.random.default_rng(3)
    spec = KVCacheSpec(3, 40, 2, 64, types)
    a, b = ops.kv_cache(spec), ops.kv_cache(spec)
    for i in range(3):
        ops.kv_write(rng.standard_normal((40, 2, 64)).astype(np.float32),
                     rng.standard_normal((40, 2, 64)).astype(np.float32), a.layer(i), np.array([0], np.int32))
    saved = a.save_prefix(24)
    b.load_prefix(saved, 16)                       # the first 16 slots of a 24-slot copy
    np.testing.assert_array_equal(b.k[:, :16], a.k[:, :16])
    np.testing.assert_array_equal(b.v[:, :16], a.v[:, :16])
    assert not b.k[:, 16:].any() and not b.v[:, 16:].any()
    k_before, v_before = a.k.copy(), a.v.copy()
    ops.kv_compact(a, 10, np.array([0, 2, 5, 6], np.int32))  # slot 10 + i <- slot 10 + offsets[i]
    for i, off in enumerate([0, 2, 5, 6]):
        np.testing.assert_array_equal(a.k[:, 10 + i], k_before[:, 10 + off])
        np.testing.assert_array_equal(a.v[:, 10 + i], v_before[:, 10 + off])
    row = {"f16": 4 * 64, "q8_0": 2 * 34, "q4_0": 2 * 18}     # reference f16 rows are float32
    assert a.n_bytes == 3 * 40 * 2 * (row[types.k] + row[types.v])


def test_a_quantized_cache_refuses_head_dim_not_a_multiple_of_32():
    with pytest.raises(ValueError, match="multiple of 32"):
        KVCacheSpec(1, 8, 1, 80, KVTypes("q8_0", "f16"))
    KVCacheSpec(1, 8, 1, 80)                       # f16 stores it


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    spec = SyntheticSpec(arch="qwen2", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=300,
                         seed=41, name="kvq")                  # head_dim 32
    path = write_synthetic_model(tmp_path_factory.mktemp("kvq") / "kvq.gguf", spec)
    return path, load_model(path, ops.load_weight)


@pytest.mark.parametrize("types", TYPES[1:], ids=str)
def test_runner_decode_equals_full_forward_and_prefix_reuse_is_exact(tiny, types):
    """Decoding token by token into a quantized cache gives the full forward's logits (each token's own K/V is
    read back quantized in both); a prompt that keeps a cached prefix gives an empty cache's logits bit for bit."""
    _, lm = tiny
    ids = [int(t) for t in np.random.default_rng(9).integers(0, 300, 40)]
    r = ModelRunner(ops, lm.config, lm.weights, 128, 16, types)
    full = r.score(ids)
    r.reset()
    step = np.concatenate([r.prefill([t], all_logits=True) for t in ids[:12]])
    np.testing.assert_allclose(step, full[:12], rtol=1e-4, atol=1e-4)     # float32 sums in other orders
    fresh = ModelRunner(ops, lm.config, lm.weights, 128, 16, types)
    fresh.reuse_prefix = False
    want = fresh.start(ids[:20] + [7, 8, 9])
    r.reset()
    r.start(ids)                                    # caches 40 tokens; the next prompt keeps 16 (one chunk)
    got = r.start(ids[:20] + [7, 8, 9])
    assert r.n_reused == 16
    np.testing.assert_array_equal(got, want)


def test_engine_reports_kv_types_and_park_unpark_keeps_the_tokens(tiny):
    path, _ = tiny
    engine = Engine(EngineConfig(model=str(path), device="cpu", max_ctx=256, prefill_chunk=16,
                                 kv_types=KVTypes("q8_0", "q4_0")))
    engine.load()
    engine.start()
    try:
        client = EngineClient(engine)
        status = client.ask(m.Status)
        assert status["kv_types"] == {"k": "q8_0", "v": "q4_0"}
        assert engine.ready_info()["kv_types"] == {"k": "q8_0", "v": "q4_0"}
        assert status["memory"]["vram"] is None or status["memory"]["vram"]["settings"]["kv_type"] == "k=q8_0,v=q4_0"
        prompt = list(range(3, 40))
        first = client.greedy(prompt, 6)
        assert client.ask(m.Park, what="target")["event"] == "result"
        assert client.ask(m.Unpark, what="target")["event"] == "result"
        assert client.greedy(prompt, 6) == first         # the prefix came back from a host copy of the bytes
        assert engine.runner.n_reused == 32
    finally:
        engine.stop(10)


def test_engine_refuses_a_quantized_kv_for_head_dim_not_a_multiple_of_32(tmp_path):
    spec = SyntheticSpec(arch="qwen2", n_layers=1, hidden=96, n_heads=2, n_kv_heads=1, ffn=64, vocab_size=300,
                         seed=42, name="hd48")                 # head_dim 48
    path = write_synthetic_model(tmp_path / "hd48.gguf", spec)
    engine = Engine(EngineConfig(model=str(path), device="cpu", max_ctx=64, kv_types=KVTypes("q4_0", "q4_0")))
    with pytest.raises(ModelLoadError, match="--kv-type q4_0: a q4_0 KV cache needs head_dim to be a multiple of 32"):
        engine.load()
