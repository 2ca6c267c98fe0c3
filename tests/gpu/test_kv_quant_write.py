"""fd_rope_kv_write into a quantized KV cache (flashd_attention.h: FD_KV_Q8_0 / FD_KV_Q4_0): the codes and
float16 scales it stores are bit for bit the reference encoder's (daemon/backends/kv_quant.py, itself bit for
bit gguf.quants / ggml's quantize_row_*_ref: tests/reference/test_kv_quant.py) applied to the rotated float32
k the kernel leaves in place and to v. Tolerance: none. For a quantized K that k (and q) is RoPE then the
Hadamard rotation (kv_rotate.cuh), bit for bit daemon/backends/kv_rotate.py's hadamard_rotate of what the
kernel leaves with a float16 K (RoPE alone; q rotated even where the slot is outside the cache); a float16 K is
not rotated. Slots outside the write stay untouched; a float16 K or V beside a quantized one is written as
before; FlashPrefill refuses a quantized cache (FD_E_SHAPE)."""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.attention_ops import KV_TYPE_CODES
from flashd.daemon.backends.cuda.kv_planes import blocks_from_planes
from flashd.daemon.backends.cuda.ops import attention_shape, rope_struct
from flashd.daemon.backends.kv_quant import encode_rows
from flashd.daemon.backends.kv_rotate import hadamard_rotate, rotates_k
from tests.reference.test_kv_quant import awkward_rows

POISON = 0xA5
FD_E_SHAPE = -3


def plane_rows(raw: np.ndarray, kv_type: str, n_kv_heads: int, max_ctx: int, head_dim: int) -> np.ndarray:
    """A quantized plane as ggml's blocks (Hkv, max_ctx, row_bytes) (backends/cuda/kv_planes.py)."""
    return blocks_from_planes(raw, kv_type, n_kv_heads, max_ctx, head_dim)


def run_write(native, dev, q, k, v, types, n_past, max_ctx, rope_dim, neox, with_q=False):
    """fd_rope_kv_write into poisoned caches of `types`: (k as the kernel leaves it, [the caches' bytes]), and
    q as the kernel leaves it first if with_q."""
    n, n_kv_heads, head_dim = k.shape
    lib = native.lib
    caches = []
    for kind in types:
        size = int(lib.fd_kv_plane_bytes(KV_TYPE_CODES[kind], n_kv_heads, max_ctx, head_dim))
        assert size > 0
        caches.append(dev.upload(np.full(size, POISON, np.uint8)))
    dq, dk, dv = dev.upload(q), dev.upload(k), dev.upload(v)
    dpos = dev.upload(np.arange(n_past, n_past + n, dtype=np.int32) * 7)
    dnp = dev.upload(np.array([n_past], np.int32))
    shape = attention_shape(native.ffi, q.shape[1], n_kv_heads, head_dim, max_ctx, k_type=types[0], v_type=types[1])
    native.check(lib.fd_rope_kv_write(dev.p(dq, "float*"), dev.p(dk, "float*"), dev.p(dv, "float*"), dev.p(caches[0]),
                                      dev.p(caches[1]), dev.p(None), dev.p(dpos, "int32_t*"), dev.p(dnp, "int32_t*"),
                                      n, shape, rope_struct(native.ffi, rope_dim, 1e6, neox), dev.stream),
                 "fd_rope_kv_write")
    dev.synchronize()
    out = (dev.download(dk), [dev.download(c) for c in caches])
    return (dev.download(dq),) + out if with_q else out


TYPES = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("f16", "q8_0"), ("q4_0", "f16")]
SHAPES = [  # n, n_heads, n_kv_heads, head_dim, rope_dim, neox
    (1, 12, 2, 128, 128, True),      # Qwen2.5 decode
    (37, 14, 2, 64, 64, True),       # a 0.5B prefill chunk, odd length
    (3, 8, 4, 256, 64, True),        # partial rope, head_dim 256
    (4, 4, 4, 96, 32, False),        # adjacent pairs, head_dim 96 (3 blocks)
]


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n,n_heads,n_kv_heads,head_dim,rope_dim,neox", SHAPES)
def test_quantized_write_is_the_reference_encoder_bit_for_bit(native, dev, rng, types, n, n_heads, n_kv_heads,
                                                              head_dim, rope_dim, neox):
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    k = (rng.standard_normal((n, n_kv_heads, head_dim)) * 4).astype(np.float32)
    v = awkward_rows(int(rng.integers(1 << 30)), n_rows=n * n_kv_heads, head_dim=head_dim).reshape(k.shape)
    n_past, max_ctx = 5, n + 9
    k_rot, planes = run_write(native, dev, q, k, v, types, n_past, max_ctx, rope_dim, neox)
    for kind, raw, x in ((types[0], planes[0], k_rot), (types[1], planes[1], v)):
        rows = x.transpose(1, 0, 2)                                    # (Hkv, n, d), the cache's order
        if kind == "f16":
            cache = raw.view(np.float16).reshape(n_kv_heads, max_ctx, head_dim)
            np.testing.assert_array_equal(cache[:, n_past:n_past + n], rows.astype(np.float16))
            written = np.zeros((n_kv_heads, max_ctx), bool)
            written[:, n_past:n_past + n] = True
            assert (cache.view(np.uint8).reshape(n_kv_heads, max_ctx, -1)[~written] == POISON).all()
            continue
        got = plane_rows(raw, kind, n_kv_heads, max_ctx, head_dim)
        np.testing.assert_array_equal(got[:, n_past:n_past + n], encode_rows(rows, kind))
        assert (got[:, :n_past] == POISON).all() and (got[:, n_past + n:] == POISON).all()


ROTATE_SHAPES = [(1, 12, 2, 128, 128, True), (37, 14, 2, 64, 64, True), (3, 8, 4, 256, 64, True),
                 (4, 4, 4, 96, 32, False), (2, 4, 2, 160, 160, True), (2, 2, 1, 512, 128, True)]


@pytest.mark.parametrize("types", [("q8_0", "f16"), ("q4_0", "q8_0"), ("f16", "q4_0")], ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n,n_heads,n_kv_heads,head_dim,rope_dim,neox", ROTATE_SHAPES)
@pytest.mark.parametrize("inside", [True, False], ids=["stored", "past-max-ctx"])
def test_rotation_of_q_and_k_is_the_reference_bit_for_bit(native, dev, rng, types, n, n_heads, n_kv_heads, head_dim,
                                                          rope_dim, neox, inside):
    """A quantized K: q and k after the kernel are hadamard_rotate(RoPE) bit for bit (the RoPE from the same
    kernel with a float16 K), and the stored codes are those of the rotated k; a float16 K: q and k are RoPE only.
    q is rotated even when the slots are past max_ctx (nothing stored): it must meet rotated keys."""
    q = rng.standard_normal((n, n_heads, head_dim)).astype(np.float32)
    k = (rng.standard_normal((n, n_kv_heads, head_dim)) * 3).astype(np.float32)
    k[..., 3] += 50.0                                                  # an outlier channel, as Qwen2's K
    v = rng.standard_normal((n, n_kv_heads, head_dim)).astype(np.float32)
    max_ctx = n + 9
    n_past = 5 if inside else max_ctx
    q_rope, k_rope, _ = run_write(native, dev, q, k, v, ("f16", "f16"), n_past, max_ctx, rope_dim, neox, with_q=True)
    q_out, k_out, planes = run_write(native, dev, q, k, v, types, n_past, max_ctx, rope_dim, neox, with_q=True)
    rotated = rotates_k(types[0])
    np.testing.assert_array_equal(q_out, hadamard_rotate(q_rope) if rotated else q_rope)
    np.testing.assert_array_equal(k_out, hadamard_rotate(k_rope) if rotated else k_rope)
    if rotated:
        got = plane_rows(planes[0], types[0], n_kv_heads, max_ctx, head_dim)
        if inside:
            np.testing.assert_array_equal(got[:, n_past:n_past + n], encode_rows(k_out.transpose(1, 0, 2), types[0]))
        else:
            assert (got == POISON).all()


def test_plane_bytes_and_refusals(native, dev):
    lib = native.lib
    assert lib.fd_kv_plane_bytes(KV_TYPE_CODES["f16"], 2, 10, 128) == 2 * 10 * 128 * 2
    assert lib.fd_kv_plane_bytes(KV_TYPE_CODES["q8_0"], 2, 10, 128) == 2 * 10 * 4 * 34
    assert lib.fd_kv_plane_bytes(KV_TYPE_CODES["q4_0"], 2, 10, 128) == 2 * 10 * 4 * 18
    assert lib.fd_kv_plane_bytes(KV_TYPE_CODES["q4_0"], 2, 10, 80) == 0          # not whole blocks
    assert lib.fd_kv_plane_bytes(7, 2, 10, 128) == 0
    # the readers not yet converted refuse a quantized cache (FD_E_SHAPE) rather than read its bytes as float16
    # (decode, masked and prefill attention read it: test_attention_kv_quant.py)
    ffi = native.ffi
    o, q = dev.upload(np.zeros((1, 256), np.float32)), dev.upload(np.zeros((1, 2, 128), np.float32))
    cache = dev.upload(np.zeros(int(lib.fd_kv_plane_bytes(1, 1, 64, 128)), np.uint8))
    ws = dev.upload(np.zeros(1 << 20, np.uint8))
    n_past = dev.upload(np.array([3], np.int32))
    shape = attention_shape(ffi, 2, 1, 128, 64, k_type="q8_0", v_type="q8_0")
    assert lib.fd_flashprefill_mean_k(dev.p(o, "float*"), dev.p(cache), 3, shape, dev.stream) == FD_E_SHAPE
    # a rotated (quantized) K needs head_dim <= 512 (the kernel's registers per lane)
    big = attention_shape(ffi, 2, 1, 1024, 64, k_type="q8_0")
    kq = dev.upload(np.zeros((1, 1, 1024), np.float32))
    pos = dev.upload(np.zeros(1, np.int32))
    assert lib.fd_rope_kv_write(dev.p(kq, "float*"), dev.p(kq, "float*"), dev.p(kq, "float*"), dev.p(cache),
                                dev.p(cache), dev.p(None), dev.p(pos, "int32_t*"), dev.p(n_past, "int32_t*"), 1, big,
                                rope_struct(ffi, 64, 1e6, True), dev.stream) == FD_E_SHAPE
    bad = attention_shape(ffi, 2, 1, 80, 64, k_type="q4_0")                     # head_dim % 32 != 0
    assert lib.fd_attention_decode(dev.p(o, "float*"), dev.p(q, "float*"), dev.p(cache), dev.p(cache),
                                   dev.p(n_past, "int32_t*"), bad, 64, dev.p(ws), dev.stream) == -1   # FD_E_ARG
