"""fd_attention_decode against a float64 brute-force softmax over the float16 cache."""
import numpy as np
import pytest

from tests.gpu.attention_oracle import attention_oracle, random_cache

from flashd.daemon.backends.cuda.ops import attention_shape

# Error budget (outputs are O(1) averages of N(0, 1) values): q is split into two float16 parts
# (~2^-22 relative), P likewise, K/V products are exact, exp2f is ~2^-22 relative, accumulation is
# float32: a few 1e-6. A wrong slot, head or split shows up as errors of order 0.1.
ATOL, RTOL = 3e-5, 1e-4


class Decode:
    """One decode-attention configuration on the device, re-launchable at any n_past (as a replayed
    CUDA graph would: same pointers, same grid, only the device scalar changes)."""

    def __init__(self, native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, n_written):
        self.native, self.dev = native, dev
        self.shape = (n_heads, n_kv_heads, head_dim, max_ctx, chunk_len)
        self.kc, self.vc = random_cache(rng, n_kv_heads, max_ctx, head_dim, n_written)
        self.dkc, self.dvc = dev.upload(self.kc), dev.upload(self.vc)
        self.scale = 1.0 / np.sqrt(head_dim)
        self.attn = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx, self.scale)
        self.unbounded = self.attn
        ws_bytes = native.lib.fd_attention_decode_workspace_bytes(self.attn, chunk_len)
        assert ws_bytes >= n_heads * (head_dim + 2) * 4
        self.ws = dev.empty((ws_bytes,), np.uint8)
        dev.fill_bytes(self.ws, 0xFF)                 # NaN garbage: stale partials must never be read
        self.n_past = dev.upload(np.zeros(1, np.int32))
        self.o = dev.empty((n_heads * head_dim,))

    def run(self, q, n_past):
        chunk_len = self.shape[4]
        dev, lib = self.dev, self.native.lib
        dq = dev.upload(q)
        dev.upload(np.array([n_past], np.int32), out=self.n_past)
        dev.fill_bytes(self.o, 0xFF)
        self.native.check(lib.fd_attention_decode(dev.p(self.o, "float*"), dev.p(dq, "float*"), dev.p(self.dkc),
                                                  dev.p(self.dvc), dev.p(self.n_past, "int32_t*"), self.attn, chunk_len,
                                                  dev.p(self.ws), dev.stream), "fd_attention_decode")
        dev.synchronize()
        return dev.download(self.o)

    def expect(self, q, n_past):
        visible = np.zeros((1, self.shape[3]), bool)
        visible[0, :n_past + 1] = True
        return attention_oracle(q, self.kc, self.vc, visible, self.scale)[0]


CONFIGS = [
    # n_heads, n_kv_heads, head_dim, max_ctx, chunk_len
    (12, 2, 128, 4096, 256),    # Qwen2.5-Coder-1.5B
    (14, 2, 64, 1000, 64),      # 0.5B; max_ctx not a multiple of the chunk
    (8, 8, 64, 777, 128),       # MHA (group 1)
    (16, 1, 128, 2048, 64),     # group of 16: one full row tile
    (40, 2, 128, 1500, 192),    # group of 20: two row tiles
    (24, 4, 256, 1200, 128),    # qwen35-style head_dim 256
    (8, 2, 256, 1001, 64),      # Qwen3.5-0.8B's heads (G = 4); max_ctx not a multiple of the chunk
    (12, 2, 256, 777, 64),      # head_dim 256, G = 6
    (40, 2, 256, 500, 192),     # head_dim 256, G = 20: two row tiles
]


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx,chunk_len", CONFIGS)
def test_decode_attention_matches_float64(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len):
    depths = sorted({0, 1, 63, 64, 65, chunk_len - 1, chunk_len, int(rng.integers(2, max_ctx)), max_ctx - 1})
    deepest = depths[-1]
    d = Decode(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, chunk_len, n_written=deepest + 1)
    for n_past in depths:
        q = (rng.standard_normal((1, n_heads, head_dim)) * rng.uniform(0.5, 3.0)).astype(np.float32)
        got = d.run(q, n_past)
        np.testing.assert_allclose(got, d.expect(q, n_past), rtol=RTOL, atol=ATOL,
                                   err_msg=f"n_past={n_past}")


def test_decode_attention_at_depth(native, dev, rng):
    """32K context, many splits with several chunks each, peaked scores (large q)."""
    d = Decode(native, dev, rng, 12, 2, 128, 32768, 256, n_written=32768)
    for n_past in (32767, 20000, 8191):
        q = (rng.standard_normal((1, 12, 128)) * 4).astype(np.float32)
        np.testing.assert_allclose(d.run(q, n_past), d.expect(q, n_past), rtol=RTOL, atol=ATOL)


def test_decode_attention_past_max_ctx_is_clamped(native, dev, rng):
    """n_past >= max_ctx (a host bug) reads no slot past the cache: it attends [0, max_ctx)."""
    d = Decode(native, dev, rng, 12, 2, 128, 300, 64, n_written=300)
    q = rng.standard_normal((1, 12, 128)).astype(np.float32)
    np.testing.assert_allclose(d.run(q, 5000), d.expect(q, 299), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,max_ctx", [(12, 2, 128, 4096), (14, 2, 64, 1000),
                                                                  (40, 2, 128, 1500)])
def test_a_max_keys_bound_changes_no_bit_while_it_holds(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx):
    """max_keys (flashd_attention.h): under attn_single_chunks chunks the launch runs one split and no combine --
    the decode runner's shallow graph -- and gives the unbounded launch's bits for every row within the bound (such a
    row is never split); past it (a caller's broken promise) the one block still attends the whole row."""
    bound = 64 * native.tuning()["attn_single_chunks"]
    if bound == 0:
        pytest.skip("attn_single_chunks 0: every row is split, a bound changes nothing")
    d = Decode(native, dev, rng, n_heads, n_kv_heads, head_dim, max_ctx, 64, n_written=max_ctx)
    bounded = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx, d.scale, max_keys=bound)
    for n_past in sorted({0, 1, 63, 64, 130, bound - 2, bound - 1}):
        q = (rng.standard_normal((1, n_heads, head_dim)) * 3).astype(np.float32)
        d.attn = d.unbounded
        want = d.run(q, n_past)
        d.attn = bounded
        np.testing.assert_array_equal(d.run(q, n_past), want, err_msg=f"n_past={n_past}")
    q = rng.standard_normal((1, n_heads, head_dim)).astype(np.float32)
    np.testing.assert_allclose(d.run(q, max_ctx - 1), d.expect(q, max_ctx - 1), rtol=RTOL, atol=ATOL)


def test_decode_attention_rejects_bad_arguments(native, dev):
    t = dev.empty((4096,))
    i = dev.upload(np.zeros(1, np.int32))
    call = lambda n_heads, n_kv_heads, head_dim, chunk_len: native.lib.fd_attention_decode(  # noqa: E731
        dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t), dev.p(t), dev.p(i, "int32_t*"),
        attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, 64, 0.1), chunk_len, dev.p(t), dev.stream)
    assert call(12, 2, 128, 100) == native.lib.FD_E_ARG      # chunk_len not a multiple of 64
    assert call(12, 5, 128, 64) == native.lib.FD_E_ARG       # heads not a multiple of kv heads
    assert call(12, 2, 96, 64) == native.lib.FD_E_SHAPE      # head_dim
    assert native.lib.fd_attention_decode_workspace_bytes(attention_shape(native.ffi, 12, 12, 128, 0), 64) == 0
    bad_bound = attention_shape(native.ffi, 12, 2, 128, 64, 0.1, max_keys=-1)
    assert native.lib.fd_attention_decode(dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t), dev.p(t),
                                          dev.p(i, "int32_t*"), bad_bound, 64, dev.p(t), dev.stream) == \
        native.lib.FD_E_ARG
