"""Split-K decode, masked (tree) and prefill attention over a q8_0 / q4_0 KV cache (fd_attention_decode /
fd_attention_masked / fd_attention_prefill with fd_attention_shape_t.k_type / v_type), against the float64
oracle.

The kernels dequantize a quantized row into their float16 tile (attention_splitk_qstage.cuh: dequant_side,
value = float16(d * q), from the codes and scales staged by cp.async) -- split-K decode / masked attention with
both K and V quantized builds its mma fragments from the staged codes instead (attention_splitk_qfrag.cuh), the
same values -- then run the float16 path's arithmetic; so the oracle is float64 attention over
exactly those float16 values (kv_quant.decode_rows rounded to float16) and the tolerance is the float16
path's (test_attention_decode.py: ATOL 3e-5, RTOL 1e-4; prefill: test_attention_prefill.py's 2e-3 * max|v|
with q rounded to float16 in the oracle, as that test). Unwritten slots have NaN scales: a read would
show. Tree rows are bitwise the decode row at their position, as on the float16 path."""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.attention_ops import KV_TYPE_CODES
from flashd.daemon.backends.cuda.kv_planes import blocks_from_planes, planes_from_blocks
from flashd.daemon.backends.cuda.ops import attention_shape
from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_rotate import hadamard_matrix, rotates_k
from tests.gpu.attention_oracle import attention_oracle, tree_mask

ATOL, RTOL = 3e-5, 1e-4
CHUNK = 64
NAN_F16 = np.array([0x7E00], np.uint16).view(np.uint8)


def to_plane(x: np.ndarray, kind: str, n_written: int) -> tuple[np.ndarray, np.ndarray]:
    """x (Hkv, max_ctx, d) float32 -> (the cache's bytes in `kind`, what the kernel reads: float16 values).
    Slots >= n_written: NaN (float16 rows) or NaN scales (quantized rows)."""
    n_kv_heads, max_ctx, d = x.shape
    if kind == "f16":
        c = x.astype(np.float16)
        c[:, n_written:] = np.nan
        return c.view(np.uint8).ravel(), c
    blocks = encode_rows(x, kind)                                       # (Hkv, max_ctx, row_bytes) ggml blocks
    per = 34 if kind == "q8_0" else 18
    b = blocks.reshape(n_kv_heads, max_ctx, d // 32, per).copy()
    b[:, n_written:, :, :2] = NAN_F16
    b = b.reshape(blocks.shape)
    return planes_from_blocks(b, kind), decode_rows(b, kind).astype(np.float16)


def read_back(raw: np.ndarray, kind: str, n_kv_heads: int, max_ctx: int, d: int) -> np.ndarray:
    """A cache's bytes (as downloaded) -> the float16 values the kernels read, (Hkv, max_ctx, d)."""
    if kind == "f16":
        return raw.view(np.float16).reshape(n_kv_heads, max_ctx, d)
    return decode_rows(blocks_from_planes(raw, kind, n_kv_heads, max_ctx, d), kind).astype(np.float16)


def setup(native, dev, rng, n_kv_heads, max_ctx, d, n_written, types):
    planes, seen = [], []
    for kind, scale in zip(types, (3.0, 1.0)):
        x = (rng.standard_normal((n_kv_heads, max_ctx, d)) * scale).astype(np.float32)
        raw, vals = to_plane(x, kind, n_written)
        assert raw.size == native.lib.fd_kv_plane_bytes(KV_TYPE_CODES[kind], n_kv_heads, max_ctx, d)
        planes.append(dev.upload(raw))
        seen.append(vals)
    return planes, seen


def decode(native, dev, q1, planes, shape, n_past, chunk=CHUNK):
    ws = dev.empty((max(native.lib.fd_attention_decode_workspace_bytes(shape, chunk), 16),), np.uint8)
    o = dev.empty((q1.size,))
    dq, dnp = dev.upload(np.ascontiguousarray(q1, np.float32)), dev.upload(np.array([n_past], np.int32))
    native.check(native.lib.fd_attention_decode(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(planes[0]),
                                                dev.p(planes[1]), dev.p(dnp, "int32_t*"), shape, chunk, dev.p(ws),
                                                dev.stream), "fd_attention_decode")
    dev.synchronize()
    return dev.download(o)


def masked(native, dev, q, planes, shape, mask, n_past):
    n = q.shape[0]
    ws_bytes = native.lib.fd_attention_workspace_bytes(n, shape, CHUNK)
    ws = dev.empty((max(ws_bytes, 16),), np.uint8)
    o = dev.empty((n, q.shape[1] * q.shape[2]))
    dq, dm, dnp = dev.upload(q), dev.upload(mask), dev.upload(np.array([n_past], np.int32))
    native.check(native.lib.fd_attention_masked(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(planes[0]),
                                                dev.p(planes[1]), dev.p(dm, "uint8_t*"), dev.p(dnp, "int32_t*"), n,
                                                shape, CHUNK, dev.p(ws), ws_bytes, dev.stream), "fd_attention_masked")
    dev.synchronize()
    return dev.download(o)


def prefill(native, dev, q, planes, shape, p0):
    n = q.shape[0]
    o = dev.empty((n, q.shape[1] * q.shape[2]))
    dev.fill_bytes(o, 0xFF)                                                # NaN poison: every output written
    dq, dnp = dev.upload(q), dev.upload(np.array([p0], np.int32))
    native.check(native.lib.fd_attention_prefill(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(planes[0]),
                                                 dev.p(planes[1]), dev.p(dnp, "int32_t*"), n, shape, dev.stream),
                 "fd_attention_prefill")
    dev.synchronize()
    return dev.download(o)


TYPES = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("f16", "q8_0"), ("q4_0", "f16")]
DECODE_CASES = [(12, 2, 128, 1000, 777), (14, 2, 64, 300, 0), (16, 16, 64, 513, 511), (8, 1, 256, 200, 130),
                (12, 2, 128, 32768, 20000)]


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,max_ctx,n_past", DECODE_CASES)
def test_decode_over_a_quantized_cache(native, dev, rng, types, n_heads, n_kv_heads, d, max_ctx, n_past):
    planes, (kc, vc) = setup(native, dev, rng, n_kv_heads, max_ctx, d, n_past + 1, types)
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    q = rng.standard_normal((1, n_heads, d)).astype(np.float32)
    visible = np.zeros((1, max_ctx), bool)
    visible[0, :n_past + 1] = True
    expect = attention_oracle(q, kc, vc, visible, 1 / np.sqrt(d))[0]
    np.testing.assert_allclose(decode(native, dev, q, planes, shape, n_past), expect, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("types", TYPES[:3], ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,n,n_past", [(12, 2, 128, 16, 1000), (14, 2, 64, 37, 63),
                                                           (8, 4, 256, 9, 5)])
def test_masked_over_a_quantized_cache_and_tree_rows_are_decode_rows(native, dev, rng, types, n_heads, n_kv_heads, d,
                                                                     n, n_past):
    max_ctx = n_past + n + 40
    planes, (kc, vc) = setup(native, dev, rng, n_kv_heads, max_ctx, d, n_past + n, types)
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    mask = tree_mask(rng, n)
    visible = np.zeros((n, max_ctx), bool)
    visible[:, :n_past] = True
    visible[:, n_past:n_past + n] = mask.astype(bool)
    got = masked(native, dev, q, planes, shape, mask, n_past)
    np.testing.assert_allclose(got, attention_oracle(q, kc, vc, visible, 1 / np.sqrt(d)), rtol=RTOL, atol=ATOL)
    # a chain (every node sees all before it): node i is the decode step at slot n_past + i, bit for bit
    chain = np.tril(np.ones((n, n), np.uint8))
    rows = masked(native, dev, q, planes, shape, chain, n_past)
    for i in (0, n // 2, n - 1):
        np.testing.assert_array_equal(rows[i], decode(native, dev, q[i:i + 1], planes, shape, n_past + i))


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,n,p0", [(12, 2, 128, 100, 0), (14, 2, 64, 37, 1000), (16, 16, 64, 1, 7),
                                                        (12, 2, 128, 512, 4096), (8, 2, 256, 70, 300),
                                                        (24, 4, 256, 9, 1000)])
def test_prefill_over_a_quantized_cache(native, dev, rng, types, n_heads, n_kv_heads, d, n, p0):
    max_ctx = p0 + n + 17
    planes, (kc, vc) = setup(native, dev, rng, n_kv_heads, max_ctx, d, p0 + n, types)
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    got = prefill(native, dev, q, planes, shape, p0)
    visible = np.arange(max_ctx)[None, :] <= p0 + np.arange(n)[:, None]
    q16 = q.astype(np.float16).astype(np.float32)                          # the kernel's q fragments
    expect = attention_oracle(q16, kc, vc, visible, 1 / np.sqrt(d))
    assert not np.isnan(got).any()
    atol = 2e-3 * np.abs(vc[:, :p0 + n].astype(np.float64)).max()
    assert np.abs(got - expect).max() <= atol


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,max_ctx,n_past", [(12, 2, 128, 1000, 777), (14, 2, 64, 300, 0),
                                                                  (8, 1, 256, 200, 130)])
@pytest.mark.parametrize("offset", [False, True], ids=["no_offset", "offset"])
def test_fused_decode_rope_is_rope_kv_write_then_decode(native, dev, rng, types, n_heads, n_kv_heads, d, max_ctx,
                                                        n_past, offset):
    """fd_attention_decode_rope over a quantized cache: o and every cache byte bit for bit fd_rope_kv_write +
    fd_attention_decode's (the new rows encoded alike and attended as stored), with and without a key offset
    (k_offset: subtracted from the RoPE'd key before the rotation; not read for an f16 K)."""
    from flashd.daemon.backends.cuda.ops import rope_struct
    ffi, lib = native.ffi, native.lib
    shape = attention_shape(ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    rope = rope_struct(ffi, d, 1e6, True)
    q = rng.standard_normal((1, n_heads, d)).astype(np.float32)
    k = (rng.standard_normal((1, n_kv_heads, d)) * 3).astype(np.float32)
    v = rng.standard_normal((1, n_kv_heads, d)).astype(np.float32)
    dc = dev.upload(key_offset_like(rng, n_kv_heads, d)) if offset else None
    pos, npast = dev.upload(np.array([n_past + 3], np.int32)), dev.upload(np.array([n_past], np.int32))
    ws = dev.empty((max(lib.fd_attention_decode_workspace_bytes(shape, CHUNK), 16),), np.uint8)
    results = []
    for fused in (True, False):
        planes, _ = setup(native, dev, np.random.default_rng(11), n_kv_heads, max_ctx, d, n_past, types)
        o = dev.empty((n_heads * d,))
        dq, dk, dv = dev.upload(q), dev.upload(k), dev.upload(v)
        if fused:
            native.check(lib.fd_attention_decode_rope(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dk, "float*"),
                                                      dev.p(dv, "float*"), dev.p(planes[0]), dev.p(planes[1]),
                                                      dev.p(dc),
                                                      dev.p(pos, "int32_t*"), dev.p(npast, "int32_t*"), shape, rope,
                                                      CHUNK, dev.p(ws), dev.stream), "fd_attention_decode_rope")
        else:
            native.check(lib.fd_rope_kv_write(dev.p(dq, "float*"), dev.p(dk, "float*"), dev.p(dv, "float*"),
                                              dev.p(planes[0]), dev.p(planes[1]), dev.p(dc), dev.p(pos, "int32_t*"),
                                              dev.p(npast, "int32_t*"), 1, shape, rope, dev.stream), "fd_rope_kv_write")
            native.check(lib.fd_attention_decode(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(planes[0]),
                                                 dev.p(planes[1]), dev.p(npast, "int32_t*"), shape, CHUNK, dev.p(ws),
                                                 dev.stream), "fd_attention_decode")
        dev.synchronize()
        results.append((dev.download(o), dev.download(planes[0]), dev.download(planes[1])))
    for fused, plain in zip(*results):
        np.testing.assert_array_equal(fused, plain)


@pytest.mark.parametrize("types", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q4_0", "f16"), ("f16", "q4_0")],
                         ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,n,n_past", [(12, 2, 128, 9, 777), (14, 2, 64, 5, 63),
                                                           (8, 1, 256, 4, 130)])
@pytest.mark.parametrize("offset", [False, True], ids=["no_offset", "offset"])
def test_tree_verify_rows_are_decode_steps_over_a_rotated_k(native, dev, rng, types, n_heads, n_kv_heads, d, n,
                                                            n_past, offset):
    """Speculative decoding's invariant over a quantized (so Hadamard-rotated) K: fd_rope_kv_write of n chain
    tokens + fd_attention_masked gives, row for row, bitwise the fused decode steps (fd_attention_decode_rope at
    n_past + i, one after the other) -- q and k are rotated by the same function in both (kv_rotate.cuh) -- and
    leaves the same cache bytes. Also: the output is the float64 attention of the unrotated q over the stored K
    mapped back by R^T (R orthonormal), within the float16 path's tolerance: the rotation is invisible. With a key
    offset (k_offset) both paths subtract it alike; the oracle over the stored keys still holds (softmax is blind
    to a per-head constant key shift)."""
    from flashd.daemon.backends.cuda.ops import rope_struct
    ffi, lib = native.ffi, native.lib
    max_ctx = n_past + n + 20
    shape = attention_shape(ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    rope = rope_struct(ffi, d, 1e6, True)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    k = (rng.standard_normal((n, n_kv_heads, d)) * 3).astype(np.float32)
    k[..., 7] += 40.0                                                  # an outlier channel
    v = rng.standard_normal((n, n_kv_heads, d)).astype(np.float32)
    dc = dev.upload(key_offset_like(rng, n_kv_heads, d)) if offset else None
    ws = dev.empty((max(lib.fd_attention_decode_workspace_bytes(shape, CHUNK),
                        lib.fd_attention_workspace_bytes(n, shape, CHUNK), 16),), np.uint8)

    planes, _ = setup(native, dev, np.random.default_rng(5), n_kv_heads, max_ctx, d, n_past, types)
    dq, dk, dv = dev.upload(q), dev.upload(k), dev.upload(v)
    pos = dev.upload(np.arange(n_past, n_past + n, dtype=np.int32))
    npast = dev.upload(np.array([n_past], np.int32))
    native.check(lib.fd_rope_kv_write(dev.p(dq, "float*"), dev.p(dk, "float*"), dev.p(dv, "float*"), dev.p(planes[0]),
                                      dev.p(planes[1]), dev.p(dc), dev.p(pos, "int32_t*"), dev.p(npast, "int32_t*"), n,
                                      shape, rope, dev.stream), "fd_rope_kv_write")
    dev.synchronize()
    q_rot = dev.download(dq)
    tree = masked(native, dev, q_rot, planes, shape, np.tril(np.ones((n, n), np.uint8)), n_past)
    tree_caches = [dev.download(p) for p in planes]

    planes, _ = setup(native, dev, np.random.default_rng(5), n_kv_heads, max_ctx, d, n_past, types)
    steps = []
    for i in range(n):
        o = dev.empty((n_heads * d,))
        dq, dk, dv = dev.upload(q[i:i + 1]), dev.upload(k[i:i + 1]), dev.upload(v[i:i + 1])
        p1, np1 = dev.upload(np.array([n_past + i], np.int32)), dev.upload(np.array([n_past + i], np.int32))
        native.check(lib.fd_attention_decode_rope(dev.p(o, "float*"), dev.p(dq, "float*"), dev.p(dk, "float*"),
                                                  dev.p(dv, "float*"), dev.p(planes[0]), dev.p(planes[1]), dev.p(dc),
                                                  dev.p(p1, "int32_t*"), dev.p(np1, "int32_t*"), shape, rope, CHUNK,
                                                  dev.p(ws), dev.stream), "fd_attention_decode_rope")
        dev.synchronize()
        steps.append(dev.download(o))
    np.testing.assert_array_equal(tree, np.stack(steps))
    for a, b in zip(tree_caches, (dev.download(p) for p in planes)):
        np.testing.assert_array_equal(a, b)

    # the rotation is invisible: q_rot = R q_rope and a stored key row is (about) R k, so with rows x -> x @ R
    # (R^T x) the float64 oracle runs in the unrotated basis; the keys are the float16 values the kernel reads
    r = hadamard_matrix(d) if rotates_k(types[0]) else np.eye(d)
    kc, vc = (read_back(raw, kind, n_kv_heads, max_ctx, d)[:, :n_past + n] for raw, kind in zip(tree_caches, types))
    visible = np.arange(n_past + n)[None, :] <= n_past + np.arange(n)[:, None]
    expect = attention_oracle(q_rot.astype(np.float64) @ r, kc.astype(np.float64) @ r, vc, visible, 1 / np.sqrt(d))
    np.testing.assert_allclose(tree, expect, rtol=RTOL, atol=ATOL)


def key_offset_like(rng, n_kv_heads: int, d: int) -> np.ndarray:
    """A key offset (n_kv_heads, d) float32 as kv_offset.py makes them: small, with a few large channels."""
    c = (rng.standard_normal((n_kv_heads, d)) * 2).astype(np.float32)
    c[:, d // 2 - 3:d // 2] += 150.0                                   # the slow RoPE pairs' bias
    return c


def f16_twin(native, dev, seen, n_heads, n_kv_heads, d, max_ctx):
    """The float16 cache holding the values the quantized kernels dequantize (seen), and its shape."""
    planes = [dev.upload(np.ascontiguousarray(v).view(np.uint8).ravel()) for v in seen]
    return planes, attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx)


def frag_perm(d: int) -> np.ndarray:
    """Split-K decode / masked attention over a quantized K and V (attention_splitk_qfrag.cuh) feeds q . k's mma
    with position k of each 16-dim slice holding dim pi(k) = 4 (k % 8 // 2) + 2 (k // 8) + k % 2 (the order its
    ldmatrix of the codes gives); the float16 kernels hold dim k there. The same products in other positions of
    one instruction; so that the comparison stays bit for bit whatever the tensor core's internal order, the
    float16 twin gets q and K with their dims in that order (a permutation of dims leaves q . k unchanged)."""
    k = np.arange(d)
    s = k % 16
    return k - s + 4 * ((s % 8) // 2) + 2 * (s // 8) + s % 2


def frag_twin(native, dev, types, seen, n_heads, n_kv_heads, d, max_ctx, q):
    """f16_twin for decode / masked attention, and the q it takes: dims in frag_perm's order where both K and V
    are quantized (the fragment step), else as they are."""
    if "f16" in types:
        return (*f16_twin(native, dev, seen, n_heads, n_kv_heads, d, max_ctx), q)
    perm = frag_perm(d)
    twin, shape = f16_twin(native, dev, [np.ascontiguousarray(seen[0][..., perm]), seen[1]], n_heads, n_kv_heads, d,
                           max_ctx)
    return twin, shape, np.ascontiguousarray(q[..., perm])


# awkward shapes for the staging pipeline: odd max_ctx (a KV head's scale rows only 2- or 4-byte aligned in
# the plane), depths off the 64-key tile, one-tile and three-tile chunks, GQA groups 1, 7, 20 (two row tiles)
@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,max_ctx,chunk", [(12, 2, 128, 1001, 64), (14, 2, 64, 777, 192),
                                                                (8, 8, 64, 321, 64), (40, 2, 128, 1500, 192),
                                                                (24, 4, 256, 301, 64)])
def test_quantized_decode_and_masked_are_the_float16_kernels_over_the_dequantized_values(
        native, dev, rng, types, n_heads, n_kv_heads, d, max_ctx, chunk):
    """Bit for bit: the quantized kernels' tiles (or, both sides quantized, their mma fragments) hold float16(d * q),
    then run the float16 kernels' arithmetic with the same split plan, so they equal the float16 kernels over a
    cache of those values (frag_twin: with q and K in the fragment step's dim order)."""
    n_written = max_ctx - 20
    planes, seen = setup(native, dev, rng, n_kv_heads, max_ctx, d, n_written, types)
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    q = rng.standard_normal((1, n_heads, d)).astype(np.float32)
    twin, twin_shape, tq = frag_twin(native, dev, types, seen, n_heads, n_kv_heads, d, max_ctx, q)
    for n_past in (0, 62, 63, 64, 65, 191, n_written // 2 + 1, n_written - 1):
        got = decode(native, dev, q, planes, shape, n_past, chunk)
        np.testing.assert_array_equal(got, decode(native, dev, tq, twin, twin_shape, n_past, chunk))
    n, n_past = 19, n_written - 19 - 3
    qn = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    mask = tree_mask(rng, n)
    twin, twin_shape, tqn = frag_twin(native, dev, types, seen, n_heads, n_kv_heads, d, max_ctx, qn)
    np.testing.assert_array_equal(masked(native, dev, qn, planes, shape, mask, n_past),
                                  masked(native, dev, tqn, twin, twin_shape, mask, n_past))


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("n_heads,n_kv_heads,d,n,p0", [(12, 2, 128, 1, 7), (14, 2, 64, 37, 1001), (8, 8, 64, 65, 63),
                                                        (12, 2, 128, 2000, 129), (12, 2, 128, 512, 4097),
                                                        (12, 2, 256, 2000, 129), (24, 4, 256, 37, 301)])
def test_quantized_prefill_is_the_float16_kernel_over_the_dequantized_values(native, dev, rng, types, n_heads,
                                                                             n_kv_heads, d, n, p0):
    """As above for prefill (both block configurations: n = 2000 gives one block per SM or more, 512 fewer; at
    head_dim 256 the wide and narrow shapes, one key split for both)."""
    max_ctx = p0 + n + 17
    planes, seen = setup(native, dev, rng, n_kv_heads, max_ctx, d, p0 + n, types)
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    twin, twin_shape = f16_twin(native, dev, seen, n_heads, n_kv_heads, d, max_ctx)
    q = rng.standard_normal((n, n_heads, d)).astype(np.float32)
    np.testing.assert_array_equal(prefill(native, dev, q, planes, shape, p0),
                                  prefill(native, dev, q, twin, twin_shape, p0))


def raw_blocks(rng, kind: str, n_kv_heads: int, max_ctx: int, d: int, scale_bits: tuple[int, int]) -> np.ndarray:
    """(n_kv_heads, max_ctx, row_bytes) ggml blocks: random codes (every byte value), scales whose float16 bit
    patterns are drawn from [lo, hi) with a random sign."""
    per = 34 if kind == "q8_0" else 18
    b = rng.integers(0, 256, size=(n_kv_heads, max_ctx, d // 32, per), dtype=np.uint8)
    bits = rng.integers(*scale_bits, size=b.shape[:3]).astype(np.uint16) | (
        rng.integers(0, 2, size=b.shape[:3]).astype(np.uint16) << 15)
    b[..., :2] = bits[..., None].view(np.uint8).reshape(*b.shape[:3], 2)
    return b.reshape(n_kv_heads, max_ctx, -1)


# scales (float16 bits): subnormal and the smallest normals (d * q mostly subnormal float16: a flushed or
# twice-rounded product changes the output's low bits, as V values ~1e-6 are its whole size), and wide (up to
# 128: products up to 16,384, scores saturating the softmax)
@pytest.mark.parametrize("scale_bits", [(1, 0x0800), (1, 0x5800)], ids=["subnormal", "wide"])
@pytest.mark.parametrize("types", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("f16", "q8_0"), ("q4_0", "f16")],
                         ids=lambda t: f"k={t[0]},v={t[1]}")
@pytest.mark.parametrize("d", [64, 128])
def test_dequantized_values_are_float16_of_d_times_q_bit_for_bit(native, dev, rng, scale_bits, types, d):
    """kv_quant.cuh's float16x2 dequantization (no conversion instructions) gives float16(d * q) -- numpy's
    rounding of the exact product -- for every code and for subnormal results: decode, masked and prefill over the
    quantized cache equal the float16 kernels over numpy's dequantized values, bit for bit."""
    n_heads, n_kv_heads, max_ctx = 8, 2, 700
    planes, seen = [], []
    for kind in types:
        if kind == "f16":
            x = (rng.standard_normal((n_kv_heads, max_ctx, d)) * 1e-3).astype(np.float16)
            planes.append(dev.upload(x.view(np.uint8).ravel()))
            seen.append(x)
            continue
        b = raw_blocks(rng, kind, n_kv_heads, max_ctx, d, scale_bits)
        planes.append(dev.upload(planes_from_blocks(b, kind)))
        with np.errstate(over="ignore"):
            seen.append(decode_rows(b, kind).astype(np.float16))
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, d, max_ctx, k_type=types[0], v_type=types[1])
    twin, twin_shape = f16_twin(native, dev, seen, n_heads, n_kv_heads, d, max_ctx)
    q = (rng.standard_normal((1, n_heads, d)) * 1e-2).astype(np.float32)
    ftwin, ftwin_shape, fq = frag_twin(native, dev, types, seen, n_heads, n_kv_heads, d, max_ctx, q)
    for n_past in (0, 63, 200, max_ctx - 1):
        np.testing.assert_array_equal(decode(native, dev, q, planes, shape, n_past),
                                      decode(native, dev, fq, ftwin, ftwin_shape, n_past))
    n, n_past = 9, 400
    qn = (rng.standard_normal((n, n_heads, d)) * 1e-2).astype(np.float32)
    mask = tree_mask(rng, n)
    ftwin, ftwin_shape, fqn = frag_twin(native, dev, types, seen, n_heads, n_kv_heads, d, max_ctx, qn)
    np.testing.assert_array_equal(masked(native, dev, qn, planes, shape, mask, n_past),
                                  masked(native, dev, fqn, ftwin, ftwin_shape, mask, n_past))
    np.testing.assert_array_equal(prefill(native, dev, qn, planes, shape, n_past),
                                  prefill(native, dev, qn, twin, twin_shape, n_past))
