"""The key offset of a quantized K (daemon/backends/kv_offset.py) on the reference backend: c is the RoPE-averaged
k bias; a cache keeps one only for a quantized (rotated) K; ReferenceOps subtracts it from k (float32) before the
rotation and the encode, in every K writer (attention, kv_write, flashprefill); q is not changed, and the
attention is the same function (a per-head constant key shift), while a q4_0 K with a large constant channel gets
far closer to the f16 result."""
import numpy as np
import pytest

from flashd.daemon.backends.base import Batch, KVCacheSpec
from flashd.daemon.backends.kv_offset import key_offset, model_key_offsets
from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_rotate import hadamard_rotate
from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.backends.reference import ReferenceOps


@pytest.mark.parametrize("neox,rope_dim", [(True, 64), (False, 64), (True, 48)])
def test_key_offset_is_the_mean_of_the_roped_bias(neox, rope_dim):
    rng = np.random.default_rng(rope_dim + neox)
    n_kv, d, n = 2, 64, 512
    b = (rng.standard_normal(n_kv * d) * 10).astype(np.float32)
    roped = ReferenceOps().rope(np.repeat(b.reshape(1, n_kv, d), n, 0), np.arange(n, dtype=np.int32), 1e4, rope_dim,
                                neox)
    got = key_offset(b, n_kv, d, 1e4, rope_dim, neox, n_positions=n)
    assert got.shape == (n_kv, d) and got.dtype == np.float32
    np.testing.assert_allclose(got, roped.astype(np.float64).mean(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got[:, rope_dim:], b.reshape(n_kv, d)[:, rope_dim:])   # unrotated dims: all of b


class _Cfg:
    linear, qk_norm, n_kv_heads, head_dim, rope_theta, rope_dim, rope_neox, rope_scaling = (None, False, 2, 64, 1e6,
                                                                                           64, True, None)


class _Layer:
    def __init__(self, bias):
        self.attn_k_bias = bias


class _Weights:
    def __init__(self, layers):
        self.layers = layers


def test_model_key_offsets_only_for_a_plain_k_bias():
    ops, cfg = ReferenceOps(), _Cfg()
    layers = [_Layer(np.full(128, 3.0, np.float32)), _Layer(np.zeros(128, np.float32))]
    got = model_key_offsets(ops, cfg, _Weights(layers))
    assert got.shape == (2, 2, 64) and got.dtype == np.float32
    assert model_key_offsets(ops, cfg, _Weights([_Layer(None)])) is None        # no k bias
    cfg.qk_norm = True
    assert model_key_offsets(ops, cfg, _Weights(layers)) is None                # qwen3: a K norm after the bias


def _cache(k_type, offsets=None, max_ctx=64):
    cache = ReferenceOps().kv_cache(KVCacheSpec(2, max_ctx, 2, 64, KVTypes(k_type, "f16")))
    cache.set_key_offset(offsets)
    return cache


def test_cache_keeps_an_offset_for_a_quantized_k_only():
    c = np.ones((2, 2, 64), np.float32)
    assert _cache("f16", c).k_offset is None
    cache = _cache("q8_0", c)
    np.testing.assert_array_equal(cache.layer(1)[0].offset, c[1])
    with pytest.raises(ValueError, match="key offsets"):
        _cache("q4_0", np.ones((2, 2, 32), np.float32))


def _inputs(rng, n, n_past):
    q = rng.standard_normal((n, 6, 64)).astype(np.float32)
    k = rng.standard_normal((n, 2, 64)).astype(np.float32)
    k[..., 60:64] += np.float32(300.0)                     # a large, nearly constant channel group
    v = rng.standard_normal((n, 2, 64)).astype(np.float32)
    pos = np.arange(n_past, n_past + n, dtype=np.int32)
    return q, k, v, Batch(ids=pos, positions=pos, n_past=np.array([n_past], np.int32), mask=None, n_tokens=n)


def test_stored_keys_are_the_rotated_keys_less_the_offset_and_attention_is_unchanged():
    rng = np.random.default_rng(0)
    ops = ReferenceOps()
    c = np.zeros((2, 2, 64), np.float32)
    c[:, :, 60:64] = 300.0
    q, k, v, batch = _inputs(rng, 20, 0)
    out = {}
    for name, k_type, offsets in (("f16", "f16", None), ("q4_0", "q4_0", None), ("q4_0+c", "q4_0", c)):
        cache = _cache(k_type, offsets)
        out[name] = ops.attention(q, k, v, cache.layer(1), batch)
        if offsets is not None:
            want = decode_rows(encode_rows(hadamard_rotate(k - c[1]), "q4_0"), "q4_0")
            np.testing.assert_array_equal(cache.layer(1)[0][:20], want)
    err = {name: np.abs(out[name] - out["f16"]).max() for name in ("q4_0", "q4_0+c")}
    assert err["q4_0+c"] < err["q4_0"] / 4, err


def test_kv_write_and_attention_store_the_same_rows():
    """Every K writer subtracts the one offset: kv_write (K/V injection) stores what attention stores."""
    rng = np.random.default_rng(1)
    ops = ReferenceOps()
    c = (rng.standard_normal((2, 2, 64)) * 50).astype(np.float32)
    q, k, v, batch = _inputs(rng, 8, 3)
    a, b = _cache("q8_0", c), _cache("q8_0", c)
    ops.attention(q, k, v, a.layer(0), batch)
    ops.kv_write(k, v, b.layer(0), np.array([3], np.int32))
    np.testing.assert_array_equal(a.k, b.k)
