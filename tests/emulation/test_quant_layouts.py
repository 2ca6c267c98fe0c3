"""CPU emulation of the device-side GGUF decoders (native/cuda/quant.cuh, quant_*.cuh) and of gemv's
per-lane indexing (native/cuda/gemv_dot.cuh row_dot), checked against gguf.quants.dequantize.

Each `Emu*` class (quant_emulation.py) is a line-by-line numpy transcription of the matching `Fmt<QT>`
(quant_float.cuh, quant_q32.cuh, quant_kquant.cuh): which bytes a lane loads from the staged
shared-memory image (including the funnel shifts for 2-byte-aligned formats), which nibbles/bits it
combines, which scale it applies, which columns its runs cover, and where it reads the activations in
shared memory. The tests rebuild whole rows from the per-lane pieces (gemv_lane_emulation.py), exactly
as the kernels' lanes would see them, and require bit equality with gguf's float32 dequantization
(every weight is a*q + b with a*q exact in float32, so no rounding freedom is left). They also check
the activation layouts: the per-lane x addresses equal the layout function, advance affinely, and give
conflict-free float4 reads per quarter-warp.
No GPU is needed.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from tests.emulation.gemv_lane_emulation import allowed_lprs, emulate_rows, pieces_per_row, random_tensor
from tests.emulation.quant_emulation import FORMATS, XL_PAD32, XL_PAD64, lds_words, spread4_to_bit4, x_phys, x_row_floats


def _cols_for(fmt, n_blocks):
    return n_blocks * fmt.BE if not fmt.IS_FLOAT else n_blocks


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.qtype.name)
def test_lanes_rebuild_gguf_dequantize_exactly(fmt):
    rng = np.random.default_rng(201)
    for n_blocks in (1, 3, 7):
        cols = _cols_for(fmt, n_blocks) if not fmt.IS_FLOAT else n_blocks * 5 + 3   # float tails: 8, 18, 38
        rows = 5
        data = random_tensor(rng, fmt, rows, cols)
        want = dequantize(data, fmt.qtype).reshape(rows, cols).astype(np.float32)
        for lpr in allowed_lprs(fmt):
            for base in sorted({0, fmt.ALIGN % 16, (2 * fmt.ALIGN) % 16, 16 - fmt.ALIGN if fmt.ALIGN < 16 else 0}):
                got, _ = emulate_rows(fmt, data, cols, lpr, base)
                assert not np.isnan(got).any(), "a weight no lane wrote"
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                              err_msg=f"{fmt.qtype.name} cols={cols} lpr={lpr} base%16={base}")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.qtype.name)
def test_lane_dot_products_match_float64(fmt):
    """gemv's per-part sums (subnormal-encoded codes times x * 2^80 per byte class, rescaled, plus
    (b - a * OFFSET) * sum x), vs float64 W @ x. Tolerance: float32 accumulation over <= 3 blocks with a
    zero-point cancellation of at most ~(|q| + OFFSET) / |q - OFFSET|: 1e-5 of sum |W||x|."""
    rng = np.random.default_rng(202)
    cols = _cols_for(fmt, 3) if not fmt.IS_FLOAT else 21
    rows = 3
    data = random_tensor(rng, fmt, rows, cols)
    w = dequantize(data, fmt.qtype).reshape(rows, cols).astype(np.float64)
    x = rng.standard_normal(cols).astype(np.float32)
    want = w @ x.astype(np.float64)
    scale = np.abs(w) @ np.abs(x.astype(np.float64))
    for lpr in allowed_lprs(fmt):
        for n_cls in (3, 1):
            _, dots = emulate_rows(fmt, data, cols, lpr, 0, x, n_cls)
            assert np.all(np.abs(dots - want) <= 1e-5 * scale + 1e-30), (fmt.qtype.name, lpr, n_cls, dots, want)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.qtype.name)
def test_x_reads_are_bank_conflict_free(fmt):
    """For each float4 read of xn (one run of every lane of a warp), the distinct addresses of a
    quarter-warp (8 lanes: one LDS.128 wavefront) must fall in distinct 16-byte bank quads. Q6_K's
    lane map admits 2-way conflicts (documented in quant_codes.cuh)."""
    allowed_ways = 2 if fmt.qtype == T.Q6_K else 1
    cols = 8 * fmt.BE if not fmt.IS_FLOAT else 8 * 32 * fmt.BE
    P = pieces_per_row(fmt, cols)
    for lpr in allowed_lprs(fmt):
        n_iter = -(-P // lpr)
        for k in range(n_iter):
            for run in range(fmt.RUNS):
                addrs = []
                for lane in range(32):
                    t = lane % lpr
                    p = t + k * lpr
                    if p >= P:
                        addrs.append(None)
                        continue
                    blk, j = p // fmt.LPB, p % fmt.LPB
                    addrs.append(x_phys(fmt.XL, blk * fmt.BE + fmt.col(j, run)))
                for qw in range(4):
                    quads = {}
                    for a in addrs[8 * qw: 8 * qw + 8]:
                        if a is None:
                            continue
                        assert a % 4 == 0, "float4 reads are 16-byte aligned"
                        quads.setdefault((a // 4) % 8, set()).add(a)
                    worst = max((len(s) for s in quads.values()), default=0)
                    assert worst <= allowed_ways, (fmt.qtype.name, lpr, k, run, qw, quads)


def test_layouts_fit_their_rows():
    for layout in (XL_PAD32, XL_PAD64):
        for cols in (1, 31, 32, 64, 896, 1536, 8960):
            pad = (cols + 63) & ~63
            phys = [x_phys(layout, e) for e in range(pad)]
            assert len(set(phys)) == pad, "a layout is one-to-one"
            assert max(phys) < x_row_floats(layout, cols)


def test_spread4_matches_bitwise_definition():
    for x in range(16):
        want = sum(((x >> i) & 1) << (8 * i + 4) for i in range(4))
        assert spread4_to_bit4(x) == want


def test_funnel_loads_match_unaligned_reads():
    rng = np.random.default_rng(203)
    smem = rng.integers(0, 256, 64, dtype=np.uint8)
    for addr in range(0, 40, 2):
        got = lds_words(smem, addr, 3, 2)
        want = [int.from_bytes(smem[addr + 4 * k: addr + 4 * k + 4].tobytes(), "little") for k in range(3)]
        assert got == want
