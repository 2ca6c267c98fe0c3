"""fd_rope_kv_write against ReferenceOps.rope (float64 angles). (The speculative commit's cache moves are
fd_kv_compact's: tests/gpu/test_kv_compact.py.)"""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.ops import attention_shape, rope_struct
from flashd.daemon.backends.reference import ReferenceOps

POISON_F16 = np.uint16(0x7E00)     # a float16 NaN: cache slots that must stay untouched


def _cache(dev, n_kv_heads, max_ctx, head_dim):
    host = np.full((n_kv_heads, max_ctx, head_dim), POISON_F16, np.uint16).view(np.float16)
    return dev.upload(host), dev.upload(host)


def _run_rope(native, dev, q, k, v, kc, vc, positions, n_past, n_heads, n_kv_heads, head_dim, rope_dim, theta,
              neox, max_ctx, scaling=None):
    n = k.shape[0]
    dq = dev.upload(q) if q is not None else None
    dk, dv = dev.upload(k), dev.upload(v)
    dpos = dev.upload(positions.astype(np.int32))
    dnp = dev.upload(np.array([n_past], np.int32))
    native.check(native.lib.fd_rope_kv_write(dev.p(dq, "float*"), dev.p(dk, "float*"), dev.p(dv, "float*"), dev.p(kc),
                                             dev.p(vc), dev.p(None), dev.p(dpos, "int32_t*"), dev.p(dnp, "int32_t*"), n,
                                             attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx),
                                             rope_struct(native.ffi, rope_dim, theta, neox, scaling),
                                             dev.stream), "fd_rope_kv_write")
    dev.synchronize()
    return (dev.download(dq) if dq is not None else None), dev.download(dk)


CASES = [
    # n, n_heads, n_kv_heads, head_dim, rope_dim, theta, neox, max position
    (1, 12, 2, 128, 128, 1e6, True, 32768),        # Qwen2.5 decode
    (37, 14, 2, 64, 64, 1e6, True, 1_000_000),     # 0.5B shapes, positions up to 1e6
    (5, 9, 3, 64, 64, 10000.0, False, 4096),       # llama-style adjacent pairs
    (3, 24, 4, 256, 64, 1e7, True, 262_144),       # qwen35: partial NeoX rope, theta 1e7
    (4, 4, 4, 96, 32, 500000.0, False, 100_000),   # partial adjacent pairs, head_dim not a power of 2
]


@pytest.mark.parametrize("n,n_heads,n_kv_heads,head_dim,rope_dim,theta,neox,max_pos", CASES)
def test_rope_kv_write_matches_reference(native, dev, rng, n, n_heads, n_kv_heads, head_dim, rope_dim, theta, neox,
                                         max_pos):
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((n, n_kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((n, n_kv_heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, max_pos, n)
    positions[0] = max_pos - 1
    max_ctx, n_past = n + 11, 7
    kc, vc = _cache(dev, n_kv_heads, max_ctx, head_dim)
    q_out, k_out = _run_rope(native, dev, q, k, v, kc, vc, positions, n_past, n_heads, n_kv_heads, head_dim,
                             rope_dim, np.float32(theta), neox, max_ctx)
    ref = ReferenceOps()
    q_ref = ref.rope(q, positions, float(np.float32(theta)), rope_dim, neox)
    k_ref = ref.rope(k, positions, float(np.float32(theta)), rope_dim, neox)
    # Same float64 angles and float32 rounding as the reference; CUDA's double pow/sincos may flip
    # one float32 rounding of cos/sin: <= 1 ulp (6e-8) times |a| + |b| (unit-scale data here)
    np.testing.assert_allclose(q_out, q_ref, rtol=0, atol=1e-6)
    np.testing.assert_allclose(k_out, k_ref, rtol=0, atol=1e-6)
    kcache, vcache = dev.download(kc), dev.download(vc)
    slots = slice(n_past, n_past + n)
    np.testing.assert_array_equal(kcache[:, slots], k_out.astype(np.float16).transpose(1, 0, 2))
    np.testing.assert_array_equal(vcache[:, slots], v.astype(np.float16).transpose(1, 0, 2))
    for c in (kcache, vcache):                      # every other slot untouched
        assert (c[:, :n_past].view(np.uint16) == POISON_F16).all()
        assert (c[:, n_past + n:].view(np.uint16) == POISON_F16).all()


def test_rope_without_q_and_out_of_range_slots(native, dev, rng):
    """q may be NULL; slots past max_ctx are not written (and nothing else is)."""
    n, n_kv_heads, head_dim, max_ctx = 6, 2, 64, 8
    k = rng.standard_normal((n, n_kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((n, n_kv_heads, head_dim)).astype(np.float32)
    positions = np.arange(5, 5 + n)
    kc, vc = _cache(dev, n_kv_heads, max_ctx, head_dim)
    _, k_out = _run_rope(native, dev, None, k, v, kc, vc, positions, 5, 4, n_kv_heads, head_dim, head_dim,
                         np.float32(1e6), True, max_ctx)
    np.testing.assert_allclose(k_out, ReferenceOps().rope(k, positions, 1e6, head_dim, True), rtol=0, atol=1e-6)
    kcache = dev.download(kc)
    np.testing.assert_array_equal(kcache[:, 5:8], k_out[:3].astype(np.float16).transpose(1, 0, 2))
    assert (kcache[:, :5].view(np.uint16) == POISON_F16).all()


def test_rope_accuracy_at_long_positions(native, dev):
    """Unit-scale inputs at positions up to 1e6 and theta up to 1e7: within 1e-6 of float64."""
    n, head_dim = 64, 128
    positions = np.linspace(30000, 1_000_000, n).astype(np.int64)
    x = np.zeros((n, 1, head_dim), np.float32)
    x[..., :head_dim // 2] = 1.0                 # rotated pairs (1, 0) -> (cos, sin)
    for theta in (1e4, 1e6, 1e7):
        kc, vc = _cache(dev, 1, n, head_dim)
        _, k_out = _run_rope(native, dev, None, x, x, kc, vc, positions, 0, 1, 1, head_dim, head_dim,
                             np.float32(theta), True, n)
        half = head_dim // 2
        angle = positions[:, None].astype(np.float64) * theta ** (-np.arange(half) * 2.0 / head_dim)
        np.testing.assert_allclose(k_out[:, 0, :half], np.cos(angle), rtol=0, atol=1e-6)
        np.testing.assert_allclose(k_out[:, 0, half:], np.sin(angle), rtol=0, atol=1e-6)


def test_rope_rejects_bad_arguments(native, dev):
    t = dev.empty((64,))
    i = dev.empty((1,), np.int32)
    args = lambda head_dim, rope_dim, theta: native.lib.fd_rope_kv_write(  # noqa: E731
        dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t), dev.p(t), dev.p(None),
        dev.p(i, "int32_t*"), dev.p(i, "int32_t*"), 1, attention_shape(native.ffi, 1, 1, head_dim, 1),
        rope_struct(native.ffi, rope_dim, theta, 1, native.ffi.NULL), dev.stream)
    assert args(64, 3, 1e4) == native.lib.FD_E_ARG         # odd rope_dim
    assert args(64, 128, 1e4) == native.lib.FD_E_ARG       # rope_dim > head_dim
    assert args(64, 64, 0.0) == native.lib.FD_E_ARG        # theta
    assert args(1024, 1024, 1e4) == native.lib.FD_E_SHAPE  # rope_dim / 2 > 256
