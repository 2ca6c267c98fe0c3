"""fd_attention_masked (tree verification) against a float64 brute-force softmax."""
import numpy as np
import pytest

from tests.gpu.attention_oracle import attention_oracle, random_cache, tree_mask

from flashd.daemon.backends.cuda.ops import attention_shape

ATOL, RTOL = 3e-5, 1e-4     # same budget as the decode kernel (same core), see test_attention_decode


CHUNK = 64     # the decode kernel's chunk_len in the daemon (ops.DECODE_CHUNK_SLOTS)


def run_masked(native, dev, q, kc, vc, mask, n_past, scale, chunk_len=CHUNK, poison=0xFF):
    n, n_heads, head_dim = q.shape
    n_kv_heads, max_ctx = kc.shape[0], kc.shape[1]
    dq, dkc, dvc, dmask = dev.upload(q), dev.upload(kc), dev.upload(vc), dev.upload(mask)
    dnp = dev.upload(np.array([n_past], np.int32))
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx, scale)
    ws_bytes = native.lib.fd_attention_workspace_bytes(n, shape, chunk_len)
    ws = dev.empty((max(ws_bytes, 16),), np.uint8)
    o = dev.empty((n, n_heads * head_dim))
    dev.fill_bytes(o, poison)
    native.check(native.lib.fd_attention_masked(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dkc), dev.p(dvc),
                                                dev.p(dmask, "uint8_t*"), dev.p(dnp, "int32_t*"), n, shape, chunk_len,
                                                dev.p(ws), ws_bytes, dev.stream), "fd_attention_masked")
    dev.synchronize()
    return dev.download(o)


def run_decode(native, dev, q1, kc, vc, n_past, scale, chunk_len=CHUNK):
    n_heads, head_dim = q1.shape[-2], q1.shape[-1]
    n_kv_heads, max_ctx = kc.shape[0], kc.shape[1]
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx, scale)
    ws = dev.empty((native.lib.fd_attention_decode_workspace_bytes(shape, chunk_len),), np.uint8)
    o = dev.empty((n_heads * head_dim,))
    dev.fill_bytes(o, 0xFF)
    dq, dkc, dvc = dev.upload(np.ascontiguousarray(q1, np.float32)), dev.upload(kc), dev.upload(vc)
    dnp = dev.upload(np.array([n_past], np.int32))
    native.check(native.lib.fd_attention_decode(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dkc), dev.p(dvc),
                                                dev.p(dnp, "int32_t*"), shape, chunk_len, dev.p(ws), dev.stream),
                 "fd_attention_decode")
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
    (8, 2, 256, 23, 1000),
    (12, 2, 256, 37, 63),
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
    got = run_masked(native, dev, q, kc, vc, mask, 0, 0.1, poison=0x3F)   # finite poison: NaN must be written
    expect = attention_oracle(q, kc, vc, visible_of(mask, 0, 64), 0.1)
    assert np.isnan(got[3]).all()
    np.testing.assert_allclose(got, expect, rtol=RTOL, atol=ATOL)   # NaN == NaN for assert_allclose


def test_causal_mask_matches_decode_kernel(native, dev, rng):
    """n = 1 with mask [[1]] is exactly (bit for bit) a decode step."""
    n_heads, n_kv_heads, head_dim, max_ctx, n_past = 14, 2, 64, 900, 811
    kc, vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, n_past + 1)
    q = rng.standard_normal((1, n_heads, head_dim)).astype(np.float32)
    masked = run_masked(native, dev, q, kc, vc, np.ones((1, 1), np.uint8), n_past, 0.125)
    decoded = run_decode(native, dev, q, kc, vc, n_past, 0.125)
    assert np.array_equal(masked[0].view(np.uint32), decoded.view(np.uint32))


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,n,n_past,max_ctx", [
    (12, 2, 128, 23, 1000, 4096),     # the 1.5B model, a DDTree of budget 22
    (14, 2, 64, 9, 63, 200),          # the 0.5B model; the tree straddles a chunk boundary
    (8, 8, 64, 40, 0, 300),           # no committed context
    (24, 4, 256, 5, 3000, 3100),
    (8, 2, 256, 23, 1000, 4096),      # Qwen3.5-0.8B's heads, a DDTree of budget 22
    (12, 2, 256, 9, 63, 200),         # head_dim 256, G = 6, straddling a chunk boundary
])
@pytest.mark.parametrize("single_chunks", [None, 0, 64])
def test_tree_rows_equal_decode_at_their_positions(native, dev, rng, n_heads, n_kv_heads, head_dim, n, n_past,
                                                   max_ctx, single_chunks):
    """Batch invariance, bit for bit: tree node i's output equals a decode step at its position
    once its root-to-node path is compacted into consecutive slots (what speculative decoding's
    commit does), so verification reproduces plain decoding exactly. Under the table's attn_single_chunks
    (None), with every row split (0) and with every row on one block (64 chunks)."""
    before = native.tuning()
    if single_chunks is not None:
        native.set_tuning(attn_single_chunks=single_chunks)
    try:
        _tree_rows_equal_decode(native, dev, rng, n_heads, n_kv_heads, head_dim, n, n_past, max_ctx)
    finally:
        native.set_tuning(**before)


def _tree_rows_equal_decode(native, dev, rng, n_heads, n_kv_heads, head_dim, n, n_past, max_ctx):
    kc, vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, n_past + n)
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    mask = tree_mask(rng, n)
    scale = 1.0 / np.sqrt(head_dim)
    got = run_masked(native, dev, q, kc, vc, mask, n_past, scale)
    for i in range(n):
        path = np.nonzero(mask[i])[0]
        kd, vd = kc.copy(), vc.copy()
        kd[:, n_past:n_past + len(path)] = kc[:, n_past + path]
        vd[:, n_past:n_past + len(path)] = vc[:, n_past + path]
        want = run_decode(native, dev, q[i:i + 1], kd, vd, n_past + len(path) - 1, scale)
        assert np.array_equal(got[i].view(np.uint32), want.view(np.uint32)), f"node {i} (depth {len(path) - 1})"


def test_masked_attention_rejects_bad_arguments(native, dev):
    t = dev.empty((64,))
    i = dev.upload(np.zeros(1, np.int32))
    m = dev.upload(np.ones(1, np.uint8))
    call = lambda n, head_dim, chunk=64, ws_bytes=0: native.lib.fd_attention_masked(  # noqa: E731
        dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t), dev.p(t), dev.p(m, "uint8_t*"), dev.p(i, "int32_t*"), n,
        attention_shape(native.ffi, 2, 1, head_dim, 64, 0.1), chunk, dev.p(t), ws_bytes, dev.stream)
    assert call(257, 64) == native.lib.FD_E_ARG
    assert call(1, 80) == native.lib.FD_E_SHAPE
    assert call(1, 64, chunk=32) == native.lib.FD_E_ARG
    assert call(0, 64) == 0
    # a workspace smaller than the launch needs is an error, not a silent overrun
    need = native.lib.fd_attention_workspace_bytes(4, attention_shape(native.ffi, 2, 1, 64, 4096), 64)
    assert need > 0
    big = dev.empty((64,))
    assert native.lib.fd_attention_masked(dev.p(big, "float*"), dev.p(big, "float*"), dev.p(big), dev.p(big),
                                          dev.p(m, "uint8_t*"), dev.p(i, "int32_t*"), 4,
                                          attention_shape(native.ffi, 2, 1, 64, 4096, 0.1), 64, dev.p(big), need - 1,
                                          dev.stream) == native.lib.FD_E_ARG
