"""A hybrid (qwen35) model's gate kernels (ABI 13; native/cuda/elementwise.cu, delta_decay.cu): fd_mul, fd_silu,
fd_sigmoid, fd_sigmoid_mul, fd_copy_cols, fd_delta_decay against float64 numpy oracles on the same float32 inputs,
and against the reference backend's float32 formulas (backends/reference.py ReferenceOps), on awkward shapes:
n = 0, 1, odd tails, unaligned pointers (the scalar path), more elements than one grid-stride pass.

Tolerances, and why:
  - fd_mul, fd_copy_cols: one float32 rounding / bit copies: equal to numpy's float32 exactly.
  - fd_sigmoid: 0.5 (1 + t), t = tanh(x / 2) rounded once: |error| <= 0.5 (ulp(t) / 2 + ulp(1 + t) / 2)
    <= 2^-24.6 absolute (the formula cancels for x << 0, the reference's too: an absolute bound, not a relative
    one). Against the reference (numpy's float32 tanh, itself within an ulp or two of the correctly rounded t):
    2^-23 absolute (measured on numpy 2.4 / x86-64: 2^-24, 78% of the elements bit for bit).
  - fd_sigmoid_mul: the bits of fd_sigmoid then fd_mul; against float64 |x| 2^-24 (the sigmoid's) plus half an ulp.
  - fd_silu: the bits of fd_swiglu(x, ones) (what hybrid_ops ran before ABI 13); against float64 as fd_swiglu's
    test (__expf and a fast divide: 1e-5 relative).
  - fd_delta_decay: z = alpha + dt_bias rounded (|dz| <= 2^-24 |z|, moving softplus by sigmoid(z) |dz|), then exp,
    log1p and the product rounded once each (<= 3 * 2^-24 relative), so |g - g64| <= |a| (2^-24 |z| sigmoid(z) +
    4 * 2^-24 softplus(z)). Against the reference within 8 ulp of g: numpy's SIMD float32 exp is itself up to 2-3
    ulp off the correctly rounded one the kernel computes (measured on numpy 2.4 / x86-64: up to 4 ulp of g, 79%
    bit for bit), except where softplus is a float32 subnormal (z < -87), which the flush-to-zero build gives as 0.
Outputs are poisoned with NaN bytes first: an element a kernel does not write fails.
"""
import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps

REF = ReferenceOps()
EPS = 2.0 ** -24
F = "float*"


def _views(dev, arrays, offset):
    """Upload each array behind `offset` leading elements (offset 1: unaligned pointers, the scalar path)."""
    return [dev.upload(np.concatenate([np.zeros(offset, a.dtype), a]))[offset:] for a in arrays]


def _out(poisoned, n, offset):
    return poisoned((n + offset,))[offset:]


def _ok(native, dev, status):
    native.check(status, "a gate kernel")
    dev.synchronize()


def _gates(rng, n):
    """Inputs of a gate: normal * 6 with the saturation ends and 0 first."""
    x = (rng.standard_normal(n) * 6).astype(np.float32)
    x[:min(n, 6)] = np.array([-100.0, 100.0, 0.0, -20.0, 20.0, -1e-3], np.float32)[:min(n, 6)]
    return x


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


# (n, pointer offset): one element, a tail of 3, a decode step's widths (H d = 2048 gate, Hv = 16 beta),
# unaligned, more than MAX_BLOCKS * 256 float4s (a second grid-stride pass), nothing
SIZES = [(1, 0), (7, 0), (16, 0), (2048, 0), (1001, 1), (4_194_311, 0), (0, 0)]


@pytest.mark.parametrize("n,offset", SIZES)
def test_sigmoid_matches_float64_and_the_reference(native, dev, rng, poisoned, n, offset):
    x = _gates(rng, n)
    (dx,) = _views(dev, [x], offset)
    y = _out(poisoned, n, offset)
    _ok(native, dev, native.lib.fd_sigmoid(dev.p(y, F), dev.p(dx, F), n, dev.stream))
    got = dev.download(y)
    assert np.all(np.abs(got - _sigmoid64(x)) <= EPS), "sigmoid beyond its absolute bound"
    assert np.all(np.abs(got.astype(np.float64) - REF.sigmoid(x)) <= 2 * EPS), "sigmoid beyond 2^-23 of the reference"


@pytest.mark.parametrize("n,offset", SIZES)
def test_sigmoid_mul_is_sigmoid_then_mul_bit_for_bit(native, dev, rng, poisoned, n, offset):
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    gate = _gates(rng, n)
    dx, dg = _views(dev, [x, gate], offset)
    y, s, ym = (_out(poisoned, n, offset) for _ in range(3))
    _ok(native, dev, native.lib.fd_sigmoid_mul(dev.p(y, F), dev.p(dx, F), dev.p(dg, F), n, dev.stream))
    _ok(native, dev, native.lib.fd_sigmoid(dev.p(s, F), dev.p(dg, F), n, dev.stream))
    _ok(native, dev, native.lib.fd_mul(dev.p(ym, F), dev.p(dx, F), dev.p(s, F), n, dev.stream))
    got = dev.download(y)
    np.testing.assert_array_equal(got.view(np.uint32), dev.download(ym).view(np.uint32))
    want = x.astype(np.float64) * _sigmoid64(gate)
    assert np.all(np.abs(got - want) <= np.abs(x) * EPS * 1.01 + np.abs(want) * EPS * 1.01 + 1e-38)


@pytest.mark.parametrize("n,offset", SIZES)
def test_mul_is_numpys_float32_product(native, dev, rng, poisoned, n, offset):
    a, b = ((rng.standard_normal(n) * 5).astype(np.float32) for _ in range(2))
    da, db = _views(dev, [a, b], offset)
    y = _out(poisoned, n, offset)
    _ok(native, dev, native.lib.fd_mul(dev.p(y, F), dev.p(da, F), dev.p(db, F), n, dev.stream))
    np.testing.assert_array_equal(dev.download(y), a * b)


def test_mul_in_place(native, dev, rng):
    a, b = (rng.standard_normal(1003).astype(np.float32) for _ in range(2))
    da, db = dev.upload(a), dev.upload(b)
    _ok(native, dev, native.lib.fd_mul(dev.p(da, F), dev.p(da, F), dev.p(db, F), 1003, dev.stream))
    np.testing.assert_array_equal(dev.download(da), a * b)


@pytest.mark.parametrize("n,offset", SIZES)
def test_silu_is_swiglu_with_ones(native, dev, rng, poisoned, n, offset):
    x = _gates(rng, n)
    dx, ones = _views(dev, [x, np.ones(n, np.float32)], offset)
    y, ys = _out(poisoned, n, offset), _out(poisoned, n, offset)
    _ok(native, dev, native.lib.fd_silu(dev.p(y, F), dev.p(dx, F), n, dev.stream))
    _ok(native, dev, native.lib.fd_swiglu(dev.p(ys, F), dev.p(dx, F), dev.p(ones, F), n, dev.stream))
    got = dev.download(y)
    np.testing.assert_array_equal(got.view(np.uint32), dev.download(ys).view(np.uint32))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, x64 / (1.0 + np.exp(-x64)), rtol=1e-5, atol=1e-30)


# (rows, x_cols, col0, cols): the conv output's q | k | v at 0.8B (C = 6144 = 2048 + 2048 + 2048) and an attention
# head's [query | gate], odd widths and offsets (unaligned rows), one column, a long prefill, nothing
COPY = [(1, 6144, 0, 2048), (1, 6144, 4096, 2048), (8, 512, 256, 256), (7, 37, 5, 19), (300, 33, 32, 1),
        (513, 2049, 1, 2048), (20_000, 300, 17, 283), (0, 8, 0, 4), (3, 8, 8, 0)]


@pytest.mark.parametrize("rows,x_cols,col0,cols", COPY)
def test_copy_cols_is_a_bit_copy(native, dev, rng, poisoned, rows, x_cols, col0, cols):
    x = rng.standard_normal((rows, x_cols)).astype(np.float32)
    dx = dev.upload(x)
    y = poisoned((max(rows * cols, 1),))[:rows * cols]
    _ok(native, dev, native.lib.fd_copy_cols(dev.p(y, F), dev.p(dx, F), rows, x_cols, col0, cols, dev.stream))
    got = dev.download(y).reshape(rows, cols)
    np.testing.assert_array_equal(got.view(np.uint32), x[:, col0:col0 + cols].view(np.uint32))


def test_copy_cols_refuses_a_slice_outside_the_row(native, dev):
    t = dev.empty((64,))
    for args in [(2, 8, 5, 4), (2, 8, -1, 4), (-1, 8, 0, 4), (2, 8, 0, -1)]:
        assert native.lib.fd_copy_cols(dev.p(t, F), dev.p(t, F), *args, dev.stream) == native.lib.FD_E_ARG


def _decay_inputs(rng, n, hv):
    alpha = (rng.standard_normal((n, hv)) * 10).astype(np.float32)
    special = np.array([-100.0, -87.5, -30.0, 19.999, 20.0, 20.001, 25.0, 0.0, -1e-4], np.float32)
    flat = alpha.reshape(-1)
    flat[:min(flat.size, special.size)] = special[:min(flat.size, special.size)]
    dt = rng.standard_normal(hv).astype(np.float32)
    a = -rng.uniform(0.05, 16.0, hv).astype(np.float32)         # -exp(A_log)
    return alpha, dt, a


def _softplus64(z):
    return np.where(z > 30, z, np.log1p(np.exp(np.minimum(z, 30))))


# (n tokens, Hv): decode steps at the 0.8B (16) and larger (32, 48) head counts, a prefill chunk, odd head counts,
# more elements than the grid's one pass (1024 blocks of 256), no tokens
@pytest.mark.parametrize("n,hv", [(1, 16), (1, 48), (7, 32), (512, 16), (513, 3), (100_003, 5), (0, 4)])
def test_delta_decay_matches_float64_and_the_reference(native, dev, rng, poisoned, n, hv):
    alpha, dt, a = _decay_inputs(rng, n, hv)
    da, ddt, dA = dev.upload(alpha), dev.upload(dt), dev.upload(a)
    g = poisoned((max(n * hv, 1),))[:n * hv]
    _ok(native, dev, native.lib.fd_delta_decay(dev.p(g, F), dev.p(da, F), dev.p(ddt, F), dev.p(dA, F), n, hv,
                                               dev.stream))
    got = dev.download(g).reshape(n, hv).astype(np.float64)
    z = alpha.astype(np.float64) + dt.astype(np.float64)
    sp = _softplus64(z)
    a64 = np.abs(a.astype(np.float64))
    bound = a64 * (EPS * np.abs(z) / (1.0 + np.exp(-np.clip(z, -700, 700))) + 4 * EPS * sp + 2e-38)
    assert np.all(np.abs(got - sp * a) <= bound), f"max error {np.max(np.abs(got - sp * a) - bound)} over the bound"
    ref = REF.delta_decay(alpha, dt, a).astype(np.float64)
    normal = np.abs(ref) >= np.finfo(np.float32).tiny * 16          # past the subnormal softplus of z < -87
    spacing = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got - ref)[normal] <= 8 * spacing[normal])
    assert np.all(np.abs(got[~normal]) <= np.finfo(np.float32).tiny * 16 * a64.max())


def test_delta_decay_in_place_and_nan(native, dev, rng):
    alpha, dt, a = _decay_inputs(rng, 9, 4)
    alpha[3, 1] = np.nan
    da, ddt, dA = dev.upload(alpha), dev.upload(dt), dev.upload(a)
    _ok(native, dev, native.lib.fd_delta_decay(dev.p(da, F), dev.p(da, F), dev.p(ddt, F), dev.p(dA, F), 9, 4,
                                               dev.stream))
    got = dev.download(da)
    assert np.isnan(got[3, 1]) and np.isnan(REF.delta_decay(alpha, dt, a)[3, 1])
    ok = ~np.isnan(alpha)
    # atol: a softplus of z < -87 is subnormal and flushed (fast math), so a * softplus may be 0 where the reference
    # keeps up to |a| * 16 * tiny -- the bound test_delta_decay_matches_float64_and_the_reference uses (inputs are fresh each run)
    np.testing.assert_allclose(got[ok], REF.delta_decay(alpha, dt, a)[ok], rtol=16 * EPS,
                               atol=np.finfo(np.float32).tiny * 16 * float(np.abs(a).max()))


def test_delta_decay_refuses_bad_arguments(native, dev):
    t = dev.empty((16,))
    assert native.lib.fd_delta_decay(dev.p(t, F), dev.p(t, F), dev.p(t, F), dev.p(t, F), 2, 0,
                                     dev.stream) == native.lib.FD_E_ARG
    assert native.lib.fd_delta_decay(dev.p(t, F), dev.p(t, F), dev.ffi.NULL, dev.p(t, F), 2, 4,
                                     dev.stream) == native.lib.FD_E_ARG
