"""fd_attention_prefill (native/cuda/attention_prefill.cu) against numpy float64.

Oracle: causal softmax attention in float64 over the same f16 K/V cache and q (drawn as float32)
rounded to f16 (the kernel rounds q into its mma fragments). Cache slots past *n_past + n - 1 hold NaN, so a kernel
that reads them (instead of zero-filling) turns outputs into NaN; outputs are poisoned first.
Tolerance: P is rounded to f16 before the PV mma, so each attention weight is off by <= 2^-11
relative; the output moves by at most ~2^-11 * max|v| through the numerator and as much through
the f32 row sum: atol = 2e-3 * max|v| (ex2.approx and f32 sums are far below that).
That bound is loose against a one-key masking error in a long row (weight ~1/L), so
test_causal_boundaries makes the key just past each token's diagonal (and the one on it) dominate
its score: a leak or a miss there moves the output by O(|v|).

On a 132-SM GPU the shapes below reach every launch configuration: at head_dim 64 / 128 4x1 and 4x2 warps
(blocks of 64 rows >= 132, and fewer); at head_dim 256 the wide 4x2 shape (64-row blocks >= 132: n = 1500
with G = 6 over 2 KV heads) and the narrow 2x2 one (fewer: every other case).
"""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.ops import attention_shape

F16 = np.float16


def f16(a):
    return np.asarray(a, np.float64).astype(F16).astype(np.float64)


def oracle(q16, k16, v16, p0, n_kv):
    """q16 (n, n_heads, hd); k16/v16 (n_kv, >= p0 + n, hd); float64."""
    n, n_heads, hd = q16.shape
    group = n_heads // n_kv
    slots = np.arange(p0 + n)
    visible = slots[None, :] <= p0 + np.arange(n)[:, None]                   # (n, S)
    out = np.empty((n, n_heads, hd))
    for kvh in range(n_kv):
        qg = q16[:, kvh * group:(kvh + 1) * group]                            # (n, G, hd)
        s = np.einsum("ngd,sd->ngs", qg, k16[kvh, :p0 + n]) / np.sqrt(hd)
        s = np.where(visible[:, None, :], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, kvh * group:(kvh + 1) * group] = np.einsum("ngs,sd->ngd", p, v16[kvh, :p0 + n]) / p.sum(-1)[..., None]
    return out


def make_cache(rng, n_kv, max_ctx, hd, n_filled):
    cache = np.full((n_kv, max_ctx, hd), np.nan, F16)                       # never-written slots
    cache[:, :n_filled] = rng.standard_normal((n_kv, n_filled, hd)).astype(F16)
    return cache


def run(native, dev, poisoned, q, k_cache, v_cache, p0, n_heads, n_kv, hd, q_offset=False):
    n = q.shape[0]
    max_ctx = k_cache.shape[1]
    if q_offset:   # q 4 bytes past an 8-byte boundary: the launcher must take the SIMT path
        buf = dev.upload(np.concatenate([[0.0], q.reshape(-1)]).astype(np.float32))
        q_d = buf[1:]
    else:
        q_d = dev.upload(q.astype(np.float32))
    k_d, v_d = dev.upload(k_cache), dev.upload(v_cache)
    np_d = dev.upload(np.array([p0], np.int32))
    o_d = poisoned((n, n_heads * hd))
    shape = attention_shape(native.ffi, n_heads, n_kv, hd, max_ctx, 1.0 / np.sqrt(hd))
    native.check(native.lib.fd_attention_prefill(dev.p(o_d, "float*"), dev.p(q_d, "float*"), dev.p(k_d), dev.p(v_d),
                                                 dev.p(np_d, "int32_t*"), n, shape, dev.stream), "fd_attention_prefill")
    return dev.download(o_d).reshape(n, n_heads, hd)


def check(o, q, k_cache, v_cache, p0, n_kv):
    n = q.shape[0]
    want = oracle(f16(q), k_cache.astype(np.float64), v_cache.astype(np.float64), p0, n_kv)
    assert not np.isnan(o).any(), "outputs left unwritten (NaN poison) or never-written cache slots read"
    atol = 2e-3 * np.abs(v_cache[:, :p0 + n].astype(np.float64)).max()
    err = np.abs(o - want)
    assert err.max() <= atol, f"max err {err.max():.3g} > {atol:.3g} at {np.unravel_index(np.argmax(err), err.shape)}"


def check_random_case(native, dev, poisoned, rng, n, p0, hd, group, extra_slots, *, q_scale=1.0, q_offset=False):
    """N(0, q_scale^2) q and N(0, 1) K/V in the first p0 + n of p0 + n + extra_slots cache slots (2 KV heads,
    `group` query heads each): run the kernel and check it against the oracle."""
    n_kv = 2
    n_heads = n_kv * group
    max_ctx = p0 + n + extra_slots
    q = (rng.standard_normal((n, n_heads, hd)) * q_scale).astype(np.float32)
    k_cache = make_cache(rng, n_kv, max_ctx, hd, p0 + n)
    v_cache = make_cache(rng, n_kv, max_ctx, hd, p0 + n)
    o = run(native, dev, poisoned, q, k_cache, v_cache, p0, n_heads, n_kv, hd, q_offset=q_offset)
    check(o, q, k_cache, v_cache, p0, n_kv)


@pytest.mark.parametrize("hd,group", [(64, 1), (64, 7), (128, 2), (128, 6), (256, 4), (256, 6)])
@pytest.mark.parametrize("p0", [0, 3, 200])
@pytest.mark.parametrize("n", [1, 5, 64, 130, 600])
def test_attention_prefill_matches_float64(native, dev, poisoned, rng, n, p0, hd, group):
    check_random_case(native, dev, poisoned, rng, n, p0, hd, group, 7, q_scale=1.5)


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_attention_prefill_many_blocks(native, dev, poisoned, rng, hd):
    """1500 tokens x 6 heads per kv head: 282 blocks of 64 rows, the 4-warp configuration (head_dim 256: the
    wide 8-warp one)."""
    check_random_case(native, dev, poisoned, rng, n=1500, p0=37, hd=hd, group=6, extra_slots=0)


@pytest.mark.parametrize("hd,group,n,p0", [(64, 7, 70, 0), (128, 6, 600, 61), (64, 2, 1500, 130),
                                           (128, 1, 40, 8192 - 40), (256, 4, 77, 31), (256, 6, 1500, 95),
                                           (256, 1, 33, 4096 - 33)])
def test_causal_boundaries(native, dev, poisoned, rng, hd, group, n, p0):
    """q of token i points at the key of slot p0 + i + 1 (invisible: must get no weight) for even i,
    and at its own slot p0 + i (visible: must dominate) for odd i."""
    n_kv = 2
    n_heads = n_kv * group
    max_ctx = p0 + n + 1
    k_cache = make_cache(rng, n_kv, max_ctx, hd, p0 + n + 1)   # slot p0 + n exists but is invisible
    v_cache = make_cache(rng, n_kv, max_ctx, hd, p0 + n + 1)
    q = rng.standard_normal((n, n_heads, hd)) * 0.3
    k64 = k_cache.astype(np.float64)
    for i in range(n):
        target = p0 + i + 1 if i % 2 == 0 else p0 + i
        for h in range(n_heads):
            kv = k64[h // group, target]
            q[i, h] += 12.0 * np.sqrt(hd) * kv / (kv @ kv)    # scaled score of the target: ~12
    q = q.astype(np.float32)
    o = run(native, dev, poisoned, q, k_cache, v_cache, p0, n_heads, n_kv, hd)
    check(o, q, k_cache, v_cache, p0, n_kv)


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_attention_prefill_simt_path(native, dev, poisoned, rng, hd):
    check_random_case(native, dev, poisoned, rng, n=37, p0=20, hd=hd, group=3, extra_slots=3, q_offset=True)


def test_attention_prefill_rejects_bad_arguments(native, dev):
    lib, ffi = native.lib, native.ffi
    q, o = dev.empty((4, 2, 96)), dev.empty((4, 2 * 96))
    kc = dev.empty((1, 16, 96), F16)
    n_past = dev.upload(np.zeros(1, np.int32))
    args = (dev.p(o, "float*"), dev.p(q, "float*"), dev.p(kc), dev.p(kc), dev.p(n_past, "int32_t*"))
    assert lib.fd_attention_prefill(*args, 4, attention_shape(ffi, 2, 1, 96, 16, 0.1), dev.stream) == lib.FD_E_SHAPE
    assert lib.fd_attention_prefill(*args, 4, attention_shape(ffi, 3, 2, 64, 16, 0.1), dev.stream) == lib.FD_E_ARG  # 3 % 2
    assert lib.fd_attention_prefill(*args, 0, attention_shape(ffi, 2, 1, 64, 16, 0.1), dev.stream) == lib.FD_E_ARG
    assert lib.fd_attention_prefill(args[0], args[1], args[2], args[3], ffi.NULL, 4,
                                    attention_shape(ffi, 2, 1, 64, 16, 0.1), dev.stream) == lib.FD_E_ARG


@pytest.mark.parametrize("n,p0", [(1, 0), (45, 1000), (2000, 17)])
def test_attention_prefill_head_dim_256_qwen35_shapes(native, dev, poisoned, rng, n, p0):
    """The real Qwen3.5 attention shapes: 0.8B (8 heads over 2 KV heads) and 27B (24 over 4), head_dim 256."""
    for n_heads, n_kv in ((8, 2), (24, 4)):
        hd, max_ctx = 256, p0 + n + 5
        q = rng.standard_normal((n, n_heads, hd)).astype(np.float32)
        k_cache = make_cache(rng, n_kv, max_ctx, hd, p0 + n)
        v_cache = make_cache(rng, n_kv, max_ctx, hd, p0 + n)
        o = run(native, dev, poisoned, q, k_cache, v_cache, p0, n_heads, n_kv, hd)
        check(o, q, k_cache, v_cache, p0, n_kv)
