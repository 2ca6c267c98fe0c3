"""fd_attention_masked (tree verification) against a float64 brute-force softmax."""
import numpy as np
import pytest

from attention_oracle import attention_oracle, random_cache

ATOL, RTOL = 3e-5, 1e-4     # same budget as the decode kernel (same core), see test_attention_decode


def tree_mask(rng, n):
    """A random tree over n nodes (node 0 the root, parents before children), as DDTree builds:
    mask[i, j] = node j is node i or one of its ancestors."""
    parent = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
    mask = np.zeros((n, n), np.uint8)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = 1
            j = parent[j]
    return mask


def run_masked(native, dev, q, kc, vc, mask, n_past, scale):
    n, n_heads, head_dim = q.shape
    n_kv_heads, max_ctx = kc.shape[0], kc.shape[1]
    dq, dkc, dvc, dmask = dev.upload(q), dev.upload(kc), dev.upload(vc), dev.upload(mask)
    dnp = dev.upload(np.array([n_past], np.int32))
    o = dev.empty((n, n_heads * head_dim))
    dev.fill_bytes(o, 0xFF)
    native.check(native.lib.fd_attention_masked(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dkc), dev.p(dvc),
                                                dev.p(dmask, "uint8_t*"), dev.p(dnp, "int32_t*"), n, n_heads,
                                                n_kv_heads, head_dim, max_ctx, scale, dev.stream),
                 "fd_attention_masked")
    dev.synchronize()
    return dev.download(o)


def visible_of(mask, n_past, max_ctx):
    n = mask.shape[0]
    visible = np.zeros((n, max_ctx), bool)
    visible[:, :n_past] = True
    visible[:, n_past:n_past + n] = mask.astype(bool)
    return visible


CASES = [
    # n_heads, n_kv_heads, head_dim, n, n_past
    (12, 2, 128, 1, 0),
    (12, 2, 128, 16, 1000),
    (12, 2, 128, 37, 63),
    (14, 2, 64, 64, 2000),
    (14, 2, 64, 5, 1),
    (8, 8, 64, 23, 130),
    (24, 4, 256, 9, 200),
    (12, 2, 128, 256, 300),
]


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,n,n_past", CASES)
def test_masked_attention_on_random_trees(native, dev, rng, n_heads, n_kv_heads, head_dim, n, n_past):
    max_ctx = n_past + n + int(rng.integers(0, 70))
    kc, vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, n_past + n)
    q = (rng.standard_normal((n, n_heads, head_dim)) * rng.uniform(0.5, 3.0)).astype(np.float32)
    mask = tree_mask(rng, n)
    scale = 1.0 / np.sqrt(head_dim)
    got = run_masked(native, dev, q, kc, vc, mask, n_past, scale)
    expect = attention_oracle(q, kc, vc, visible_of(mask, n_past, max_ctx), scale)
    np.testing.assert_allclose(got, expect, rtol=RTOL, atol=ATOL)


def test_masked_attention_arbitrary_masks_and_empty_rows(native, dev, rng):
    """Any mask (not only trees). With n_past = 0 a token whose mask row is empty sees nothing: NaN,
    like the reference's softmax of all -inf; the other rows are unaffected."""
    n, n_heads, n_kv_heads, head_dim = 21, 12, 2, 128
    kc, vc = random_cache(rng, n_kv_heads, 64, head_dim, n)
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    mask = (rng.random((n, n)) < 0.4).astype(np.uint8)
    mask[3] = 0
    got = run_masked(native, dev, q, kc, vc, mask, 0, 0.1)
    expect = attention_oracle(q, kc, vc, visible_of(mask, 0, 64), 0.1)
    assert np.isnan(got[3]).all()
    np.testing.assert_allclose(got, expect, rtol=RTOL, atol=ATOL)   # NaN == NaN for assert_allclose


def test_causal_mask_matches_decode_kernel(native, dev, rng):
    """n = 1 with mask [[1]] is exactly a decode step."""
    n_heads, n_kv_heads, head_dim, max_ctx, n_past = 14, 2, 64, 900, 811
    kc, vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, n_past + 1)
    q = rng.standard_normal((1, n_heads, head_dim)).astype(np.float32)
    masked = run_masked(native, dev, q, kc, vc, np.ones((1, 1), np.uint8), n_past, 0.125)
    ws = dev.empty((native.lib.fd_attention_decode_workspace_bytes(n_heads, head_dim, max_ctx, 64),), np.uint8)
    o = dev.empty((n_heads * head_dim,))
    dq, dkc, dvc = dev.upload(q), dev.upload(kc), dev.upload(vc)
    dnp = dev.upload(np.array([n_past], np.int32))
    native.check(native.lib.fd_attention_decode(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dkc), dev.p(dvc),
                                                dev.p(dnp, "int32_t*"), n_heads, n_kv_heads, head_dim, max_ctx, 64,
                                                0.125, dev.p(ws), dev.stream), "fd_attention_decode")
    dev.synchronize()
    np.testing.assert_allclose(masked[0], dev.download(o), rtol=1e-5, atol=1e-6)


def test_masked_attention_rejects_bad_arguments(native, dev):
    t = dev.empty((64,))
    i = dev.upload(np.zeros(1, np.int32))
    m = dev.upload(np.ones(1, np.uint8))
    call = lambda n, head_dim: native.lib.fd_attention_masked(  # noqa: E731
        dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t), dev.p(t), dev.p(m, "uint8_t*"), dev.p(i, "int32_t*"), n,
        2, 1, head_dim, 64, 0.1, dev.stream)
    assert call(257, 64) == native.lib.FD_E_ARG
    assert call(1, 80) == native.lib.FD_E_SHAPE
    assert call(0, 64) == 0
