"""fd_rmsnorm, fd_add, fd_swiglu against float64 numpy oracles on the same float32 inputs."""
import numpy as np
import pytest


def _rmsnorm64(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


# cols: the models' hidden sizes (float4 path), odd sizes (scalar path), 1
@pytest.mark.parametrize("rows,cols", [(1, 1536), (3, 896), (7, 8960), (5, 7), (2, 1), (1, 4099)])
def test_rmsnorm_matches_float64(native, dev, rng, poisoned, rows, cols):
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    eps = 1e-6
    dx, dw = dev.upload(x), dev.upload(w)
    y = poisoned((rows, cols))
    native.check(native.lib.fd_rmsnorm(dev.p(y, "float*"), dev.p(dx, "float*"), dev.p(dw, "float*"), rows, cols,
                                       eps, dev.stream), "fd_rmsnorm")
    dev.synchronize()
    # float32 sum of squares over <= 8960 terms (~1e-6 relative) and rsqrtf (2 ulp)
    np.testing.assert_allclose(dev.download(y), _rmsnorm64(x, w, eps), rtol=1e-5, atol=1e-6)


def test_rmsnorm_in_place(native, dev, rng):
    x = rng.standard_normal((4, 1536)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 1536).astype(np.float32)
    dx, dw = dev.upload(x), dev.upload(w)
    native.check(native.lib.fd_rmsnorm(dev.p(dx, "float*"), dev.p(dx, "float*"), dev.p(dw, "float*"), 4, 1536,
                                       1e-5, dev.stream), "fd_rmsnorm")
    dev.synchronize()
    np.testing.assert_allclose(dev.download(dx), _rmsnorm64(x, w, 1e-5), rtol=1e-5, atol=1e-6)


def test_rmsnorm_rejects_bad_shapes(native, dev):
    t = dev.empty((4,))
    assert native.lib.fd_rmsnorm(dev.p(t, "float*"), dev.p(t, "float*"), dev.p(t, "float*"), 1, 0, 1e-6,
                                 dev.stream) == native.lib.FD_E_ARG
    assert native.lib.fd_rmsnorm(dev.ffi.NULL, dev.p(t, "float*"), dev.p(t, "float*"), 1, 4, 1e-6,
                                 dev.stream) == native.lib.FD_E_ARG


def _views(dev, arrays, offset):
    """Upload each array behind `offset` leading elements, so offset 1 gives unaligned pointers."""
    out = []
    for a in arrays:
        t = dev.upload(np.concatenate([np.zeros(offset, a.dtype), a]))
        out.append(t[offset:])
    return out


@pytest.mark.parametrize("n,offset", [(1, 0), (7, 0), (4096, 0), (1_000_003, 0), (1001, 1)])
def test_add_is_exact(native, dev, rng, poisoned, n, offset):
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    da, db = _views(dev, [a, b], offset)
    y = poisoned((n + offset,))[offset:]
    native.check(native.lib.fd_add(dev.p(y, "float*"), dev.p(da, "float*"), dev.p(db, "float*"), n, dev.stream),
                 "fd_add")
    dev.synchronize()
    np.testing.assert_array_equal(dev.download(y), a + b)   # one float32 rounding, like numpy


@pytest.mark.parametrize("n,offset", [(1, 0), (9, 0), (8960, 0), (300_001, 0), (1003, 1)])
def test_swiglu_matches_float64(native, dev, rng, poisoned, n, offset):
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    gate[:min(n, 4)] = np.array([-100.0, 100.0, 0.0, -20.0], np.float32)[:min(n, 4)]   # saturation ends
    up = rng.standard_normal(n).astype(np.float32)
    dg, du = _views(dev, [gate, up], offset)
    y = poisoned((n + offset,))[offset:]
    native.check(native.lib.fd_swiglu(dev.p(y, "float*"), dev.p(dg, "float*"), dev.p(du, "float*"), n,
                                      dev.stream), "fd_swiglu")
    dev.synchronize()
    g64 = gate.astype(np.float64)
    expect = g64 / (1.0 + np.exp(-g64)) * up
    # __expf(x) = 2^(x log2 e): relative error ~|x| * 2^-23 (2e-6 at |x| = 20) plus a fast divide
    np.testing.assert_allclose(dev.download(y), expect, rtol=1e-5, atol=1e-30)


def test_swiglu_in_place(native, dev, rng):
    gate = rng.standard_normal(1000).astype(np.float32)
    up = rng.standard_normal(1000).astype(np.float32)
    dg, du = dev.upload(gate), dev.upload(up)
    native.check(native.lib.fd_swiglu(dev.p(dg, "float*"), dev.p(dg, "float*"), dev.p(du, "float*"), 1000,
                                      dev.stream), "fd_swiglu")
    dev.synchronize()
    g64 = gate.astype(np.float64)
    np.testing.assert_allclose(dev.download(dg), g64 / (1 + np.exp(-g64)) * up, rtol=1e-5, atol=1e-30)
