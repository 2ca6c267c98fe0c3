"""The searched-scale q4_0 encoder (daemon/backends/kv_quant_search.py): ggml's block format (kv_quant.py's decoder
reads it), candidate 0 alone is ggml's encoder bit for bit, the searched block never reads back worse than ggml's in
squared error (the butterfly sum's rounding aside: checked in float64 with a tolerance of a few float32 ulps of the
sum), and it is better on average for Gaussian blocks (what a Hadamard-rotated K block looks like)."""
import numpy as np
import pytest

from flashd.daemon.backends import kv_quant_search as ks
from flashd.daemon.backends.kv_quant import dequantize_q4_0, quantize_q4_0


def _blocks(seed, n=4096):
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((n, 32)).astype(np.float32)
    b[: n // 4] *= np.float32(37.5)                      # other magnitudes
    b[n // 4: n // 2, 3] += np.float32(9.0)              # a block with one large value (ggml's d is right there)
    b[-1] = 0.0                                          # an all-zero block: d = 0, every code 8
    return b


def test_candidate_zero_alone_is_ggml(monkeypatch):
    b = _blocks(0)
    monkeypatch.setattr(ks, "SCALE_FACTORS", (1.0,))
    np.testing.assert_array_equal(ks.quantize_q4_0_searched(b), quantize_q4_0(b))


def test_scale_multipliers():
    s = ks.scale_multipliers()
    assert s.dtype == np.float32 and s[0] == np.float32(-0.125) and len(set(s.tolist())) == len(s)


def test_butterfly_sum_is_the_warp_order():
    v = np.random.default_rng(1).standard_normal((7, 32)).astype(np.float32)
    s = v.copy()
    for h in (16, 8, 4, 2, 1):                           # lane j adds lane j ^ h, as __shfl_xor_sync
        s = np.stack([s[:, j] + s[:, j ^ h] for j in range(32)], axis=1)
    np.testing.assert_array_equal(ks.butterfly_sum(v), s[:, 0])
    assert np.all(s == s[:, :1])                         # every lane holds the same bits


def test_never_worse_than_ggml_and_better_on_gaussian_blocks():
    b = _blocks(2)
    got = dequantize_q4_0(ks.quantize_q4_0_searched(b)).astype(np.float64)
    ggml = dequantize_q4_0(quantize_q4_0(b)).astype(np.float64)
    e_got = ((got - b) ** 2).sum(1)
    e_ggml = ((ggml - b) ** 2).sum(1)
    assert np.all(e_got <= e_ggml * (1 + 1e-5) + 1e-30)  # float32 butterfly sums vs float64: a few ulps
    gauss = slice(b.shape[0] // 2, -1)
    assert e_got[gauss].mean() < 0.93 * e_ggml[gauss].mean()
    assert np.all(got[-1] == 0.0)


@pytest.mark.parametrize("shape", [(32,), (3, 2, 128)])
def test_shapes(shape):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    out = ks.quantize_q4_0_searched(x)
    assert out.shape == (x.size // 32, 18) and out.dtype == np.uint8
