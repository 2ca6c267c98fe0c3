"""CPU emulation of native/cuda/gemv_rows_dp4a.cuh (one-row Q4_K items of gemv_rows_tma on dp4a lanes): its integer
group sums and where its partials land, transcribed from the kernel.

  - rows_dp4a_group: per 128-column group, the low nibbles masked and dotted as unsigned bytes, the high nibbles
    masked in place (16 x their value) and shifted back after the dot, the x sums by dp4a against 0x01010101, the
    (scale, min) bytes from rows_scales_mins -- S and M equal the mma item's (test_gemv_rows_layout checks those
    against the ggml layout), so d * S - dmin * M is the float64 dot of the rows with the x codes, exactly;
  - the partial of row r goes to element e = 2 (r >> 3) of lane 4 (r & 7) -- where rows_fold reads (row r, x row 0),
    the up matrix's 4 x 32 floats further on.
The float chain (fmaf over the groups, the lanes' shuffles) is the GPU test's to check, bit for bit against the mma items
(tests/gpu/test_gemv_rows.py test_dp4a_items_are_the_mma_items_bit_for_bit).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from flashd.scripts.random_weights import random_weights

from gguf.quants import dequantize

from tests.emulation.test_gemv_rows_layout import (codes_q4k, header_words, q6k_a, rows_scales_mins, scale_min_k4,
                                                   u32)


def dot4_us(a: int, b: int, c: int) -> int:
    """dp4a.u32.s32: sum over k of unsigned byte k of a times signed byte k of b, plus c"""
    for k in range(4):
        bb = (b >> (8 * k)) & 0xFF
        c += ((a >> (8 * k)) & 0xFF) * (bb - 256 if bb & 0x80 else bb)
    return c


def dp4a_group(row: np.ndarray, k: int, xb: np.ndarray, h: int) -> tuple[int, int]:
    """rows_dp4a_group's (S, M) for group h of super-block k of one row, x row 0's codes xb (uint8 view)"""
    sm = rows_scales_mins(header_words(row, k))
    sw, mw = (sm[1], sm[3]) if h else (sm[0], sm[2])
    S = M = 0
    for pp in range(2):
        run = 144 * k + 16 + 32 * (2 * h + pp)
        q = [u32(row, run + 4 * i) for i in range(8)]                   # q0 = words 0..3, q1 = words 4..7
        xg = 256 * k + 128 * h + 64 * pp
        xw = [u32(xb, xg + 4 * i) for i in range(16)]                   # 16 words: columns 0..63 of the run
        lo = hi = 0
        for i in range(8):                                              # word i: columns 4i.. (low), 32 + 4i.. (high)
            lo = dot4_us(q[i] & 0x0F0F0F0F, xw[i], lo)
            hi = dot4_us(q[i] & 0xF0F0F0F0, xw[8 + i], hi)
        assert hi % 16 == 0                                             # so the kernel's hi >> 4 is exact
        sl = sh = 0
        for i in range(8):
            sl = dot4_us(0x01010101, xw[i], sl)
            sh = dot4_us(0x01010101, xw[8 + i], sh)
        jl, jh = 2 * pp, 2 * pp + 1
        S += ((sw >> (8 * jl)) & 0xFF) * lo + ((sw >> (8 * jh)) & 0xFF) * (hi >> 4)
        M += ((mw >> (8 * jl)) & 0xFF) * sl + ((mw >> (8 * jh)) & 0xFF) * sh
    return S, M


def test_group_sums_are_the_dequantized_dot():
    rng = np.random.default_rng(23)
    w = random_weights(rng, T.Q4_K, 16, 512).reshape(16, -1)
    for trial in range(3):
        x = rng.integers(-127, 128, 512).astype(np.int8)
        if trial == 1:
            x[:] = 127                                                  # the extreme codes
        elif trial == 2:
            x[::2] = -127
        xb = x.view(np.uint8)
        for r in range(16):
            for k in range(2):
                blk = w[r, 144 * k:144 * k + 144]
                d, dmin = np.frombuffer(bytes(blk[:4]), np.float16).astype(np.float64)
                sc, m = scale_min_k4(blk[4:16])
                wrow = d * sc[np.arange(256) // 32] * codes_q4k(blk) - dmin * m[np.arange(256) // 32]
                for h in range(2):
                    S, M = dp4a_group(w[r], k, xb, h)
                    cols = slice(256 * k + 128 * h, 256 * k + 128 * h + 128)
                    want = wrow[128 * h:128 * h + 128] @ x[cols].astype(np.float64)
                    assert d * S - dmin * M == want, (trial, r, k, h)


def dot4_ss(a: int, b: int, c: int) -> int:
    """dp4a.s32.s32: signed bytes times signed bytes, plus c"""
    for k in range(4):
        aa, bb = (a >> (8 * k)) & 0xFF, (b >> (8 * k)) & 0xFF
        c += (aa - 256 if aa & 0x80 else aa) * (bb - 256 if bb & 0x80 else bb)
    return c


def dp4a_group_q6k(row: np.ndarray, k: int, xb: np.ndarray, h: int) -> int:
    """rows_dp4a_group_q6k's S for group h of super-block k of one row (rows_q6k_a's words, signed dp4a with x)"""
    b = 210 * k
    S = 0
    for u in range(2):
        l0 = [u32(row, b + 64 * h + 16 * u + 4 * w) for w in range(4)]
        l1 = [u32(row, b + 64 * h + 32 + 16 * u + 4 * w) for w in range(4)]
        qh = [u32(row, b + 128 + 32 * h + 16 * u + 4 * w) for w in range(4)]
        for s in range(4):
            isum = 0
            for w in range(4):
                isum = dot4_ss(q6k_a(l0[w], l1[w], qh[w], s), u32(xb, 256 * k + 128 * h + 32 * s + 16 * u + 4 * w), isum)
            S += int(np.int8(row[b + 192 + 8 * h + 2 * s + u])) * isum
    return S


def test_q6k_group_sums_are_the_dequantized_dot():
    rng = np.random.default_rng(29)
    w = random_weights(rng, T.Q6_K, 16, 512).reshape(16, -1)
    want_w = dequantize(w, T.Q6_K).reshape(16, 512).astype(np.float64)
    for trial in range(2):
        x = rng.integers(-127, 128, 512).astype(np.int8)
        if trial:
            x[:] = -127
        xb = x.view(np.uint8)
        for r in range(16):
            for k in range(2):
                d = float(np.frombuffer(bytes(w[r, 210 * k + 208:210 * k + 210]), np.float16)[0])
                for h in range(2):
                    cols = slice(256 * k + 128 * h, 256 * k + 128 * h + 128)
                    assert d * dp4a_group_q6k(w[r], k, xb, h) == want_w[r, cols] @ x[cols].astype(np.float64), (r, k, h)


def test_partials_land_where_the_fold_reads_row_r_of_x_row_0():
    """rows_fold (gemv_rows.cuh), NTT = 1: thread o reads part[item][kk * 32 + ln] for (row (ln >> 2) + 8 ((kk & 3) >> 1),
    x row 2 (ln & 3) + (kk & 1) + 8 (kk >> 2)); the dp4a item writes row r's partial at 2 (r >> 3) * 32 + 4 (r & 7)."""
    read = {}
    for o in range(4 * 32):
        ln, kk = o & 31, (o >> 5) % 4
        row, xr = (ln >> 2) + 8 * ((kk & 3) >> 1), 2 * (ln & 3) + (kk & 1)
        if xr == 0:
            read[row] = kk * 32 + ln
    assert sorted(read) == list(range(16))
    for r in range(16):
        assert read[r] == 2 * (r >> 3) * 32 + 4 * (r & 7)
