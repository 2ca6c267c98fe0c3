"""gemv_rows_tma.cuh -- gemv_rows' kernel with whole 16-row tiles staged by bulk copies (sm_90; the tuning's
gemv_rows_tma = pieces in flight, 0: every warp copies its own items with cp.async). The arithmetic and the fold are
the cp.async kernel's, so every output must be the same bits whatever gemv_rows_tma says: that is the oracle here
(test_gemv_rows.py checks the arithmetic itself against float64, under the table's value, which takes this path).

Shapes: the 1.5B's gate / up (560 tiles: several a CTA, every n), a wide Q6_K ffn_down (one 117 KB tile a CTA), an
lm_head-like Q6_K launch (many tiles a CTA: a ring of stages reused), attention-like multi launches of mixed formats,
and shapes the bulk copy must refuse (Q6_K / Q8_0 rows % 16 != 0 whose last tile is not whole 16-byte units: the
cp.async kernel runs them) -- n_x 1..32 with and without the norm, the residual aliased to y, chunks of 1 and 2
super-blocks.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from flashd.scripts.random_weights import random_weights

from tests.gpu.test_gemv import bits, call_gemv, call_kind
from tests.gpu.test_gemv_rows import rows_on  # noqa: F401 (fixture: gemv_rows on, chunks of 1 or 2)

N_XS = [1, 2, 8, 9, 17, 32]


def sm90(dev):
    return int(dev.info()["cc"].split(".")[0]) >= 9


@pytest.mark.parametrize("kind,qtypes,rows,cols", [
    ("swiglu", (T.Q4_K, T.Q4_K), 8960, 1536),   # the 1.5B's gate / up: 560 tiles, 4-5 a CTA
    ("gemv", (T.Q6_K, None), 1536, 8960),       # ffn_down Q6_K: a 117 KB tile a CTA
    ("gemv", (T.Q6_K, None), 20000, 1536),      # lm_head-like: ~10 tiles a CTA through a ring of stages
    ("multi", (T.Q4_K, T.Q6_K), 1536, 1536),    # attention-like, two formats in one launch
    ("gemv", (T.Q8_0, None), 896, 4864),        # the 0.5B's ffn_down (Q8_0 in some files)
    ("swiglu", (T.Q4_K, T.Q6_K), 4864, 1024),   # gate and up of different formats (different row bytes)
    ("gemv", (T.Q6_K, None), 333, 768),         # rows % 16 != 0, last tile not whole 16-byte units: refused
    ("multi", (T.Q8_0, T.Q8_0), 100, 96),       # Q8_0 96 columns (a short chunk), rows % 16 != 0
], ids=["gate-up", "down-q6k", "lm-head", "qkv-mixed", "down-q8", "swiglu-mixed", "q6k-awkward", "q8-narrow"])
def test_bulk_copies_never_change_a_result(native, dev, rng, poisoned, rows_on, kind, qtypes, rows, cols):
    if not sm90(dev):
        pytest.skip("bulk copies need sm_90: the cp.async kernel runs every call here")
    qa, qb = qtypes
    d_a = dev.upload(random_weights(rng, qa, rows, cols))
    d_b = dev.upload(random_weights(rng, qb, rows, cols)) if qb is not None else None
    x = dev.upload((rng.standard_normal((32, cols)) * rng.uniform(0.1, 10.0, (32, 1))).astype(np.float32))
    d_norm = dev.upload((1 + 0.1 * rng.standard_normal(cols)).astype(np.float32))
    bias = dev.upload(rng.standard_normal(rows).astype(np.float32))

    def run(n_x, norm):
        return [bits(o) for o in call_kind(native, dev, poisoned, kind, d_a, qa, d_b, qb, rows, cols, x, n_x, norm,
                                           bias)]

    cases = [(n_x, norm) for n_x in N_XS for norm in (None, d_norm)]
    native.set_tuning(gemv_rows_tma=0)
    want = [run(*c) for c in cases]
    for look in (1, 3, 8):
        native.set_tuning(gemv_rows_tma=look)
        for (n_x, norm), w in zip(cases, want):
            for k, (got, ref) in enumerate(zip(run(n_x, norm), w)):
                assert np.array_equal(got, ref), f"look={look} n_x={n_x} norm={norm is not None} matrix {k}"


def test_bulk_copies_with_an_aliased_residual(native, dev, rng, rows_on):
    """fd_gemv with y aliasing the residual (the decode step's o_proj / ffn_down), Q4_K and Q6_K: the same bits."""
    if not sm90(dev):
        pytest.skip("bulk copies need sm_90")
    for qtype, rows, cols in [(T.Q4_K, 1536, 8960), (T.Q6_K, 1536, 1536)]:
        w = dev.upload(random_weights(rng, qtype, rows, cols))
        x = dev.upload(rng.standard_normal((32, cols)).astype(np.float32))
        res = rng.standard_normal((32, rows)).astype(np.float32)
        outs = {}
        for look in (0, 1):
            native.set_tuning(gemv_rows_tma=look)
            for n_x in (1, 8, 32):
                y = dev.upload(np.ascontiguousarray(res[:n_x]))
                call_gemv(native, dev, y, w, qtype, rows, cols, x, n_x, None, None, y)
                outs[(look, n_x)] = bits(dev.download(y))
        for n_x in (1, 8, 32):
            assert np.array_equal(outs[(0, n_x)], outs[(1, n_x)]), f"{qtype.name} n_x={n_x}"
