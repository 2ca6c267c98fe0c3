"""fd_gemm_f16 and fd_gemm_swiglu_f16 (native/cuda/gemm.cu) against numpy float64.

Oracle: the same inputs as the kernel sees them -- x drawn as float32 and rounded to f16 (the kernel
rounds x while staging it; rounding float64 draws straight to f16 would differ from the kernel's
f32 -> f16 on rare double-rounding ties), w already f16 -- multiplied in float64.
Launch paths on a 132-SM sm_90 GPU (gemm.cu's launcher): k = 1536 with m <= 513 runs the cluster
split-k kernel (2 to 8 shares); k <= 136 the plain tiles -- 64x64 (m = 17), 64x128 (512 x 1536),
128x128 (513 x 2048); x misaligned by 4 bytes the SIMT kernel.
Tolerance, per element: the tensor cores multiply f16 pairs exactly and accumulate in f32, so the
error is f32 summation error over k terms: ~k * 2^-24 * sum_k |x||w| in the worst case (typically
~sqrt(k) * 2^-24 of it); we allow 4x that, since the tensor cores' f32 adder truncates rather than
rounds, plus the f32 epilogue's roundings (2^-23 of |acc| + |bias| + |residual|). A dropped or misplaced 8-wide k chunk moves an element by
~sqrt(8) / k of sum |x||w| (2e-3 at k = 1536), well above that bound.
"""
import numpy as np
import pytest

F16 = np.float16


def f16(a):
    return np.asarray(a, np.float64).astype(F16).astype(np.float64)


def _tol(k, x16, w16):
    """Per-element bound of the f32 accumulation error (see module docstring)."""
    return 4.0 * k * 2.0 ** -24 * (np.abs(x16) @ np.abs(w16).T) + 1e-30


def _run_gemm(native, dev, poisoned, x, w, bias=None, residual=None, alias=False):
    m, k = x.shape
    n = w.shape[0]
    x_d = dev.upload(x.astype(np.float32))
    w_d = dev.upload(w.astype(F16))
    b_d = dev.upload(bias.astype(np.float32)) if bias is not None else None
    r_d = dev.upload(residual.astype(np.float32)) if residual is not None else None
    y_d = r_d if alias else poisoned((m, n))
    native.check(native.lib.fd_gemm_f16(dev.p(y_d, "float*"), dev.p(x_d, "float*"), dev.p(w_d), m, n, k,
                                        dev.p(b_d, "float*"), dev.p(r_d, "float*"), dev.stream), "fd_gemm_f16")
    dev.synchronize()
    return dev.download(y_d)


def _check_gemm(y, x, w16, bias=None, residual=None):
    x16 = f16(x)
    acc = x16 @ w16.T
    want = acc.copy()
    extra = np.abs(acc)
    if bias is not None:
        want += bias
        extra = extra + np.abs(bias)
    if residual is not None:
        want += residual
        extra = extra + np.abs(residual)
    tol = _tol(x.shape[1], x16, w16) + 2.0 ** -23 * extra
    assert not np.isnan(y).any(), "output elements left unwritten (NaN poison) or NaN produced"
    err = np.abs(y - want)
    assert np.all(err <= tol), f"max err/tol {np.max(err / tol):.3g} at {np.unravel_index(np.argmax(err / tol), y.shape)}"


@pytest.mark.parametrize("k", [8, 136, 1536])
@pytest.mark.parametrize("n", [1, 7, 200, 1536 + 512])
@pytest.mark.parametrize("m", [1, 17, 128, 513])
def test_gemm_matches_float64(native, dev, poisoned, rng, m, n, k):
    x = (rng.standard_normal((m, k)) * 2.0).astype(np.float32)   # f32 as the kernel sees it
    w16 = f16(rng.standard_normal((n, k)) * 0.05)
    y = _run_gemm(native, dev, poisoned, x, w16)
    _check_gemm(y, x, w16)


@pytest.mark.parametrize("with_bias,with_residual,alias", [(True, False, False), (False, True, False),
                                                            (True, True, False), (True, True, True),
                                                            (False, True, True)])
@pytest.mark.parametrize("m,n,k", [(17, 200, 136), (512, 1536, 136), (513, 1536, 1536)])
def test_gemm_bias_residual_and_aliasing(native, dev, poisoned, rng, m, n, k, with_bias, with_residual, alias):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w16 = f16(rng.standard_normal((n, k)) * 0.05)
    bias = rng.standard_normal(n) if with_bias else None
    residual = rng.standard_normal((m, n)) * 3.0 if with_residual else None
    y = _run_gemm(native, dev, poisoned, x, w16, bias, residual, alias=alias)
    _check_gemm(y, x, w16, bias, residual)


def test_gemm_split_k_is_deterministic(native, dev, poisoned, rng):
    """The cluster split-k path sums partial tiles in a fixed order: the same inputs give the same
    bits every run (no atomics)."""
    m, n, k = 513, 1536, 1536
    x = rng.standard_normal((m, k)).astype(np.float32)
    w16 = f16(rng.standard_normal((n, k)) * 0.05)
    bias = rng.standard_normal(n)
    first = _run_gemm(native, dev, poisoned, x, w16, bias)
    for _ in range(3):
        assert np.array_equal(_run_gemm(native, dev, poisoned, x, w16, bias), first)


def _silu(v):
    return v / (1.0 + np.exp(-v))


@pytest.mark.parametrize("m,n,k", [(1, 7, 8), (17, 200, 136), (128, 1, 1536), (513, 2048, 1536), (64, 4864, 896)])
def test_gemm_swiglu_matches_float64(native, dev, poisoned, rng, m, n, k):
    x = (rng.standard_normal((m, k)) * 2.0).astype(np.float32)   # f32 as the kernel sees it
    wg16 = f16(rng.standard_normal((n, k)) * 0.05)
    wu16 = f16(rng.standard_normal((n, k)) * 0.05)
    x_d = dev.upload(x.astype(np.float32))
    wg_d, wu_d = dev.upload(wg16.astype(F16)), dev.upload(wu16.astype(F16))
    y_d = poisoned((m, n))
    native.check(native.lib.fd_gemm_swiglu_f16(dev.p(y_d, "float*"), dev.p(x_d, "float*"), dev.p(wg_d), dev.p(wu_d),
                                               m, n, k, dev.stream), "fd_gemm_swiglu_f16")
    y = dev.download(y_d)
    x16 = f16(x)
    gate, up = x16 @ wg16.T, x16 @ wu16.T
    want = _silu(gate) * up
    # propagate the accumulators' bounds: |d silu(g)/dg| <= 1.1; plus f32 rounding of silu and product
    tol_g, tol_u = _tol(k, x16, wg16), _tol(k, x16, wu16)
    tol = 1.1 * tol_g * np.abs(up) + np.abs(_silu(gate)) * tol_u + 1.1 * tol_g * tol_u + 2.0 ** -20 * np.abs(want)
    assert not np.isnan(y).any()
    err = np.abs(y - want)
    assert np.all(err <= tol + 1e-30), f"max err/tol {np.max(err / (tol + 1e-30)):.3g}"


def test_gemm_misaligned_x_takes_the_simt_path(native, dev, poisoned, rng):
    """x 4 bytes off a 16-byte boundary cannot feed the float4 staging: the launcher must fall back
    to the SIMT kernel, which rounds x to f16 the same way."""
    m, n, k = 37, 45, 72
    x = rng.standard_normal((m, k)).astype(np.float32)
    w16 = f16(rng.standard_normal((n, k)) * 0.05)
    bias, residual = rng.standard_normal(n), rng.standard_normal((m, n))
    buf = dev.upload(np.concatenate([[0.0], x.reshape(-1)]).astype(np.float32))
    x_d = buf[1:]
    w_d, b_d, r_d = dev.upload(w16.astype(F16)), dev.upload(bias.astype(np.float32)), dev.upload(residual.astype(np.float32))
    y_d = poisoned((m, n))
    native.check(native.lib.fd_gemm_f16(dev.p(y_d, "float*"), dev.p(x_d, "float*"), dev.p(w_d), m, n, k,
                                        dev.p(b_d, "float*"), dev.p(r_d, "float*"), dev.stream), "fd_gemm_f16")
    _check_gemm(dev.download(y_d), x, w16, bias, residual)
    wu16 = f16(rng.standard_normal((n, k)) * 0.05)
    wu_d = dev.upload(wu16.astype(F16))
    y_d = poisoned((m, n))
    native.check(native.lib.fd_gemm_swiglu_f16(dev.p(y_d, "float*"), dev.p(x_d, "float*"), dev.p(w_d), dev.p(wu_d),
                                               m, n, k, dev.stream), "fd_gemm_swiglu_f16")
    want = _silu(f16(x) @ w16.T) * (f16(x) @ wu16.T)
    np.testing.assert_allclose(dev.download(y_d), want, rtol=1e-4, atol=1e-4)   # k = 72: f32 sums, tiny


def test_gemm_rejects_bad_arguments(native, dev):
    lib, ffi = native.lib, native.ffi
    x, w, y = dev.empty((4, 16)), dev.empty((4, 16), F16), dev.empty((4, 4))
    px, pw, py = dev.p(x, "float*"), dev.p(w), dev.p(y, "float*")
    null = ffi.NULL
    assert lib.fd_gemm_f16(py, px, pw, 4, 4, 12, null, null, dev.stream) == lib.FD_E_SHAPE   # k % 8 != 0
    assert lib.fd_gemm_f16(py, px, pw, 0, 4, 16, null, null, dev.stream) == lib.FD_E_ARG
    assert lib.fd_gemm_f16(py, px, pw, 4, 0, 16, null, null, dev.stream) == lib.FD_E_ARG
    assert lib.fd_gemm_f16(null, px, pw, 4, 4, 16, null, null, dev.stream) == lib.FD_E_ARG
    assert lib.fd_gemm_swiglu_f16(py, px, pw, null, 4, 4, 16, dev.stream) == lib.FD_E_ARG
    assert lib.fd_gemm_swiglu_f16(py, px, pw, pw, 4, 4, 20, dev.stream) == lib.FD_E_SHAPE
