"""The numpy reference ops against independent float64 formulations, on awkward shapes."""
import zlib

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch
from flashd.daemon.backends.reference import ReferenceOps
from tests.gpu.attention_oracle import attention_oracle

ops = ReferenceOps()


@pytest.fixture
def rng(request):
    """Seeded by the test's id: the same inputs every run, different ones per test and parameter set."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (5, 896)])
def test_rmsnorm(rng, rows, cols):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ops.rmsnorm(x, w, 1e-6), want, rtol=1e-5, atol=1e-6)  # f32 rounding


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("head_dim,rope_dim", [(8, 8), (64, 64), (16, 6)])
def test_rope_is_a_complex_rotation(rng, neox, head_dim, rope_dim):
    n, heads = 5, 3
    x = rng.standard_normal((n, heads, head_dim)).astype(np.float32)
    pos = rng.integers(0, 40000, n).astype(np.int32)
    theta = 1e6
    out = ops.rope(x, pos, theta, rope_dim, neox)
    half = rope_dim // 2
    freq = theta ** (-np.arange(half) * 2.0 / rope_dim)
    rot = np.exp(1j * pos[:, None, None] * freq[None, None, :])
    if neox:
        z = x[..., :half] + 1j * x[..., half:rope_dim]
        zr = z * rot
        want = np.concatenate([zr.real, zr.imag, x[..., rope_dim:]], -1)
    else:
        z = x[..., 0:rope_dim:2] + 1j * x[..., 1:rope_dim:2]
        zr = z * rot
        want = x.astype(np.float64).copy()
        want[..., 0:rope_dim:2], want[..., 1:rope_dim:2] = zr.real, zr.imag
    # angles up to 4e4 rad are formed in float64, the rotation in float32: ~1e-6 relative
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def brute_attention(q, keys, values, visible):
    """Per query and head, in float64: softmax over visible slots -- the attention tests' brute-force oracle
    (tests/gpu/attention_oracle.py) over (slot, head, d) keys and values."""
    return attention_oracle(q, keys.transpose(1, 0, 2), values.transpose(1, 0, 2), visible, 1 / np.sqrt(q.shape[2]))


@pytest.mark.parametrize("n,n_past,heads,kv_heads,d", [(1, 0, 2, 1, 4), (1, 13, 6, 2, 8), (7, 5, 4, 4, 16),
                                                        (5, 0, 3, 1, 8)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_with_cache_and_mask(rng, n, n_past, heads, kv_heads, d, masked):
    max_ctx = n_past + n + 3
    k_cache = np.full((max_ctx, kv_heads, d), np.nan, np.float32)   # poisoned: unwritten slots must not be read
    v_cache = np.full((max_ctx, kv_heads, d), np.nan, np.float32)
    k_cache[:n_past] = rng.standard_normal((n_past, kv_heads, d))
    v_cache[:n_past] = rng.standard_normal((n_past, kv_heads, d))
    q = rng.standard_normal((n, heads, d)).astype(np.float32)
    k = rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    v = rng.standard_normal((n, kv_heads, d)).astype(np.float32)
    mask = None
    new_visible = np.tril(np.ones((n, n), bool))
    if masked:   # a random tree-like mask: each token sees itself and a random subset of earlier ones
        new_visible = np.tril(rng.random((n, n)) < 0.5) | np.eye(n, dtype=bool)
        mask = new_visible
    batch = Batch(ids=np.zeros(n, np.int32), positions=np.arange(n, dtype=np.int32),
                  n_past=np.array([n_past], np.int32), mask=mask)
    out = ops.attention(q, k, v, (k_cache, v_cache), batch)
    keys = np.concatenate([k_cache[:n_past], k])
    values = np.concatenate([v_cache[:n_past], v])
    visible = np.concatenate([np.ones((n, n_past), bool), new_visible], 1)
    np.testing.assert_allclose(out, brute_attention(q, keys, values, visible), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(k_cache[n_past:n_past + n], k)


def test_attention_overflow_is_an_error(rng):
    cache = (np.zeros((4, 1, 4), np.float32), np.zeros((4, 1, 4), np.float32))
    q = np.zeros((2, 1, 4), np.float32)
    batch = Batch(ids=np.zeros(2, np.int32), positions=np.arange(2, dtype=np.int32),
                  n_past=np.array([3], np.int32))
    with pytest.raises(ValueError, match="overflow"):
        ops.attention(q, q, q, cache, batch)


def test_linear_and_swiglu(rng):
    x = rng.standard_normal((3, 17)).astype(np.float32)
    w = rng.standard_normal((11, 17)).astype(np.float32)
    b = rng.standard_normal(11).astype(np.float32)
    r = rng.standard_normal((3, 11)).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b + r
    np.testing.assert_allclose(ops.linear(x, w, b, r), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ops.linear(x[:1], w), want[:1] - b - r[:1], rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(100).astype(np.float32) * 5
    u = rng.standard_normal(100).astype(np.float32)
    # float32 tanh-form sigmoid: ~1 ulp of the O(1) operands
    np.testing.assert_allclose(ops.swiglu(g, u), g / (1 + np.exp(-g.astype(np.float64))) * u, rtol=1e-5, atol=1e-6)
