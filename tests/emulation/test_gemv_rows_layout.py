"""CPU emulation of native/cuda/gemv_rows.cuh's index math and integer fragments (the lab's --host-check idea,
bench/lab/gemv_mma_rows_lab.cu, at the level of one item and one launch's bookkeeping).

  - fragments: the kernel's A builders (gemv_rows_item.cuh rows_q4k_a, rows_q6k_a's SWAR q - 32, Q8_0's words,
    rows_q50_a's nibbles + spread high bits - 16)
    and B loads (8 or 4 consecutive x codes at 8t / 4t), fed through the PTX ISA's mma.m16n8k32 / m16n8k16 8-bit
    fragment tables (written down here from the ISA, not from the kernel), against integer dot products of the codes
    read straight from the ggml block layouts -- whose decoding is itself checked against gguf.quants.dequantize;
  - staging (rows_stage_mat): every row's chunk lands at slot row r from its 16-byte floor, inside the row stride
    (rows_stride), for every format, chunk size and row alignment; a row's last chunk may be short;
  - chunks (rows_ks, rows_chunk): a function of cols and the tuning only, covering every column once, <= 36 a row;
  - the fold's thread -> (row, x row) map: every (row, x row) of a tile's 16 x 8 NT outputs exactly once.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from flashd.scripts.random_weights import random_weights

LANE = np.arange(32)
G, TQ = LANE // 4, LANE % 4                 # PTX groupID, threadID_in_group
MASK = 0xFFFFFFFF


def u32(b: np.ndarray, off: int) -> int:
    """little-endian 32-bit word at byte offset off (any alignment: the kernel's rows_ld32u)"""
    return int.from_bytes(bytes(b[off:off + 4]), "little")


def signed_bytes(w: int) -> list[int]:
    return [((w >> (8 * i)) & 0xFF) - (256 if (w >> (8 * i)) & 0x80 else 0) for i in range(4)]


def unsigned_bytes(w: int) -> list[int]:
    return [(w >> (8 * i)) & 0xFF for i in range(4)]


def mma(K: int, A: list, B: list, a_signed: bool) -> np.ndarray:
    """D (16 x 8) of mma.m16n8k{K} from per-lane registers (PTX ISA tables for 8-bit A row / B col):
    A reg0 = (row g, k 4t..4t+3), reg1 = (g + 8, 4t..), reg2 = (g, 16 + 4t..), reg3 = (g + 8, 16 + 4t..);
    B reg0 = (k 4t..4t+3, col g), reg1 = (16 + 4t.., g)."""
    Am, Bm = np.zeros((16, K), np.int64), np.zeros((K, 8), np.int64)
    ab = signed_bytes if a_signed else unsigned_bytes
    for lane in range(32):
        g, t = G[lane], TQ[lane]
        Am[g, 4 * t:4 * t + 4] = ab(A[lane][0])
        Am[g + 8, 4 * t:4 * t + 4] = ab(A[lane][1])
        Bm[4 * t:4 * t + 4, g] = signed_bytes(B[lane][0])
        if K == 32:
            Am[g, 16 + 4 * t:20 + 4 * t] = ab(A[lane][2])
            Am[g + 8, 16 + 4 * t:20 + 4 * t] = ab(A[lane][3])
            Bm[16 + 4 * t:20 + 4 * t, g] = signed_bytes(B[lane][1])
    return Am @ Bm


# ---- the ggml layouts, spelled out (not the kernel's builders) --------------------------------------------------
def codes_q4k(blk: np.ndarray) -> np.ndarray:
    out = np.empty(256, np.int64)
    for v in range(256):
        j, l = v // 32, v % 32
        b = int(blk[16 + 32 * (j // 2) + l])
        out[v] = (b >> 4) if j & 1 else (b & 0xF)
    return out


def codes_q6k(blk: np.ndarray) -> np.ndarray:
    out = np.empty(256, np.int64)
    for v in range(256):
        h, s, l = v // 128, (v % 128) // 32, v % 32
        lo = (int(blk[64 * h + 32 * (s & 1) + l]) >> (4 * (s >> 1))) & 0xF
        hi = (int(blk[128 + 32 * h + l]) >> (2 * s)) & 3
        out[v] = (lo | (hi << 4)) - 32
    return out


def scale_min_k4(sk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 over a Q4_K header's 12 scale bytes: the 8 sub-blocks' 6-bit (scale, min)"""
    sk = sk.astype(np.int64)
    sc, m = np.empty(8, np.int64), np.empty(8, np.int64)
    for j in range(8):
        if j < 4:
            sc[j], m[j] = sk[j] & 63, sk[j + 4] & 63
        else:
            sc[j] = (sk[j + 4] & 0xF) | ((sk[j - 4] >> 6) << 4)
            m[j] = (sk[j + 4] >> 4) | ((sk[j] >> 6) << 4)
    return sc, m


def test_layout_decoders_match_gguf():
    rng = np.random.default_rng(1)
    for qtype in (T.Q4_K, T.Q6_K):
        data = random_weights(rng, qtype, 1, 256)
        blk = data.reshape(-1)
        ref = dequantize(data, qtype).reshape(-1).astype(np.float64)
        if qtype == T.Q6_K:
            d = float(np.frombuffer(bytes(blk[208:210]), np.float16)[0])
            sc = np.array([int(np.int8(blk[192 + i])) for i in range(16)])
            got = d * sc[np.arange(256) // 16] * codes_q6k(blk)
        else:
            d, dmin = (float(v) for v in np.frombuffer(bytes(blk[0:4]), np.float16))
            sc, m = scale_min_k4(blk[4:16])
            got = d * sc[np.arange(256) // 32] * codes_q4k(blk) - dmin * m[np.arange(256) // 32]
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


# ---- the kernel's fragment builders, transcribed ----------------------------------------------------------------
def rows_scales_mins(h: tuple) -> tuple:
    """gemv_rows_item.cuh rows_scales_mins: h = the header's words (h.x = d, dmin; h.y, h.z, h.w = scale bytes)"""
    _, y, z, w = h
    return (y & 0x3F3F3F3F, ((w & 0x0F0F0F0F) | (((y >> 6) & 0x03030303) << 4)) & MASK,
            z & 0x3F3F3F3F, (((w >> 4) & 0x0F0F0F0F) | (((z >> 6) & 0x03030303) << 4)) & MASK)


def byte_perm(x: int, y: int, s: int) -> int:
    """PTX prmt / __byte_perm (default mode): result byte i = byte (s >> 4i) & 7 of the 8 bytes x (0..3), y (4..7)"""
    pool = x | (y << 32)
    return sum(((pool >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def test_q4k_scales_in_swar_are_ggmls():
    """every sub-block's (scale, min) as rows_item_q4k reads them from rows_scales_mins -- the scale as byte jj of
    its word (shift and mask), the min as byte jj broadcast to all four bytes by __byte_perm(w, 0, 0x1111 jj) (the
    A fragment of the mins' mma) -- equals get_scale_min_k4, over random and extreme scale bytes"""
    rng = np.random.default_rng(7)
    cases = [rng.integers(0, 256, 12) for _ in range(2000)] + [np.full(12, 255), np.zeros(12, np.int64)]
    for sk in cases:
        words = tuple(u32(np.concatenate([np.zeros(4, np.int64), sk]).astype(np.uint8), 4 * i) for i in range(4))
        sm = rows_scales_mins(words)
        sc, m = scale_min_k4(sk)
        for j in range(8):
            half, jj = j >> 2, j & 3
            ws, wm = (sm[1], sm[3]) if half else (sm[0], sm[2])
            assert (ws >> (8 * jj)) & 0xFF == sc[j], (list(sk), j)
            assert byte_perm(wm, 0, 0x1111 * jj) == int(m[j]) * 0x01010101, (list(sk), j)


def q4k_a(qa: tuple, qb: tuple, hh: int) -> list:
    s = 4 * hh
    return [(qa[0] >> s) & 0x0F0F0F0F, (qb[0] >> s) & 0x0F0F0F0F, (qa[1] >> s) & 0x0F0F0F0F, (qb[1] >> s) & 0x0F0F0F0F]


def q50_a(blk: np.ndarray, c0: int) -> int:
    """rows_q50_a, transcribed: the int8 codes q - 16 of columns c0 .. c0 + 3 of one Q5_0 block (22 bytes)."""
    qh = u32(blk, 2)
    lo = (u32(blk, 6 + (c0 & 15)) >> (4 * (c0 >> 4))) & 0x0F0F0F0F
    h = (((qh >> c0) & 0xF) * 0x00204081) & 0x01010101
    return (lo | ((h ^ 0x01010101) * 0xF0)) & MASK


def codes_q50(row: np.ndarray, n_blocks: int) -> np.ndarray:
    """ggml's Q5_0 layout spelled out: column j < 16 of a block is qs[j] & 15 with qh bit j as bit 4, column j + 16
    is qs[j] >> 4 with qh bit j + 16; the code is that 5-bit value - 16."""
    out = np.empty(32 * n_blocks, np.int64)
    for b in range(n_blocks):
        blk = row[22 * b:22 * b + 22]
        qh = u32(blk, 2)
        for j in range(16):
            out[32 * b + j] = (int(blk[6 + j]) & 15 | ((qh >> j) & 1) << 4) - 16
            out[32 * b + j + 16] = (int(blk[6 + j]) >> 4 | ((qh >> (j + 16)) & 1) << 4) - 16
    return out


def test_q50_codes_are_ggml_dequantize():
    rng = np.random.default_rng(5)
    w = random_weights(rng, T.Q5_0, 3, 256).reshape(3, -1)
    d = np.array([[np.frombuffer(bytes(w[r, 22 * b:22 * b + 2]), np.float16)[0] for b in range(8)] for r in range(3)])
    want = dequantize(w, T.Q5_0).reshape(3, 256)
    for r in range(3):
        np.testing.assert_array_equal(codes_q50(w[r], 8) * np.repeat(d[r].astype(np.float64), 32), want[r])


def q6k_a(ql0: int, ql1: int, qh: int, s: int) -> int:
    lo = ((ql1 if s & 1 else ql0) >> (4 * (s >> 1))) & 0x0F0F0F0F
    hi = ((((qh >> (2 * s)) & 0x03030303) + 0x0E0E0E0E) << 4) & 0xF0F0F0F0
    return (lo | hi) & MASK


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_fragments_give_the_integer_dot_products(fmt):
    rng = np.random.default_rng(2)
    qtype = {"Q4_K": T.Q4_K, "Q6_K": T.Q6_K, "Q8_0": T.Q8_0, "Q5_0": T.Q5_0}[fmt]
    w = random_weights(rng, qtype, 16, 256).reshape(16, -1)
    x = rng.integers(-127, 128, (8, 256)).astype(np.int8)
    xb = x.view(np.uint8)
    if fmt == "Q4_K":
        codes = np.stack([codes_q4k(w[r]) for r in range(16)])
        subs = [(32 * j, 32, j) for j in range(8)]
    elif fmt == "Q6_K":
        codes = np.stack([codes_q6k(w[r]) for r in range(16)])
        subs = [(128 * h + 32 * s + 16 * u, 16, (h, u, s)) for h in range(2) for u in range(2) for s in range(4)]
    elif fmt == "Q8_0":
        codes = np.stack([np.array([int(np.int8(w[r][34 * (v // 32) + 2 + v % 32])) for v in range(256)])
                          for r in range(16)])
        subs = [(32 * bl, 32, bl) for bl in range(8)]
    else:
        codes = np.stack([codes_q50(w[r], 8) for r in range(16)])
        subs = [(32 * bl, 32, bl) for bl in range(8)]
    for c0, n, key in subs:
        A, B = [], []
        for lane in range(32):
            g, t = G[lane], TQ[lane]
            r0, r1 = w[g], w[g + 8]
            if fmt == "Q4_K":
                p, hh = key // 2, key & 1
                qa = (u32(r0, 16 + 32 * p + 8 * t), u32(r0, 20 + 32 * p + 8 * t))
                qb = (u32(r1, 16 + 32 * p + 8 * t), u32(r1, 20 + 32 * p + 8 * t))
                A.append(q4k_a(qa, qb, hh))
                B.append((u32(xb[g], c0 + 8 * t), u32(xb[g], c0 + 8 * t + 4)))
            elif fmt == "Q6_K":
                h, u, s = key
                a0 = q6k_a(u32(r0, 64 * h + 16 * u + 4 * t), u32(r0, 64 * h + 32 + 16 * u + 4 * t),
                           u32(r0, 128 + 32 * h + 16 * u + 4 * t), s)
                a1 = q6k_a(u32(r1, 64 * h + 16 * u + 4 * t), u32(r1, 64 * h + 32 + 16 * u + 4 * t),
                           u32(r1, 128 + 32 * h + 16 * u + 4 * t), s)
                A.append([a0, a1])
                B.append((u32(xb[g], c0 + 4 * t),))
            elif fmt == "Q8_0":
                bl = key
                A.append([u32(r0, 34 * bl + 2 + 8 * t), u32(r1, 34 * bl + 2 + 8 * t), u32(r0, 34 * bl + 6 + 8 * t),
                          u32(r1, 34 * bl + 6 + 8 * t)])
                B.append((u32(xb[g], c0 + 8 * t), u32(xb[g], c0 + 8 * t + 4)))
            else:
                b0, b1 = r0[22 * key:22 * key + 22], r1[22 * key:22 * key + 22]
                A.append([q50_a(b0, 8 * t), q50_a(b1, 8 * t), q50_a(b0, 8 * t + 4), q50_a(b1, 8 * t + 4)])
                B.append((u32(xb[g], c0 + 8 * t), u32(xb[g], c0 + 8 * t + 4)))
        got = mma(n, A, B, a_signed=fmt != "Q4_K")
        want = codes[:, c0:c0 + n] @ x[:, c0:c0 + n].astype(np.int64).T
        np.testing.assert_array_equal(got, want, err_msg=f"{fmt} sub-block {key}")


def header_words(row: np.ndarray, k: int) -> tuple:
    return tuple(u32(row, 144 * k + 4 * i) for i in range(4))


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K"])
def test_group_sums_are_the_dequantized_dot(fmt):
    """rows_item_q4k / rows_item_q6k's integer sums over one 128-column x group, transcribed: S = sum_j sc_j * (the
    sub-block's mma), Q4_K's M accumulated by the mins' mma (A = m_j broadcast by __byte_perm into every k-slot, the
    same B) -- and d * S - dmin * M (Q6_K: d * S) is the float64 dot of the rows (from the ggml layout) with the x
    codes, exactly: the float step a group then only scales it by xd."""
    rng = np.random.default_rng(11)
    qtype = T.Q4_K if fmt == "Q4_K" else T.Q6_K
    w = random_weights(rng, qtype, 16, 512).reshape(16, -1)
    x = rng.integers(-127, 128, (8, 512)).astype(np.int8)
    x[0] = 127                                            # the extreme codes too
    xb = x.view(np.uint8)
    if fmt == "Q4_K":   # the rows in float64 from the ggml layout (gguf's dequantize rounds d * sc to float32)
        want_w = np.zeros((16, 512))
        for r in range(16):
            for k in range(2):
                blk = w[r, 144 * k:144 * k + 144]
                d, dmin = np.frombuffer(bytes(blk[:4]), np.float16).astype(np.float64)
                sc, m = scale_min_k4(blk[4:16])
                want_w[r, 256 * k:256 * k + 256] = d * sc[np.arange(256) // 32] * codes_q4k(blk) - dmin * m[np.arange(256) // 32]
    else:
        want_w = dequantize(w, qtype).reshape(16, 512).astype(np.float64)
    for k in range(2):
        for half in range(2):
            c_lo = 256 * k + 128 * half
            S, M = np.zeros((16, 8), np.int64), np.zeros((16, 8), np.int64)
            if fmt == "Q4_K":
                sms = [rows_scales_mins(header_words(w[r], k)) for r in range(16)]
                for jj in range(4):
                    j = 4 * half + jj
                    p, hh = j >> 1, j & 1
                    A, Am, B = [], [], []
                    for lane in range(32):
                        g, t = G[lane], TQ[lane]
                        qa = (u32(w[g], 144 * k + 16 + 32 * p + 8 * t), u32(w[g], 144 * k + 20 + 32 * p + 8 * t))
                        qb = (u32(w[g + 8], 144 * k + 16 + 32 * p + 8 * t),
                              u32(w[g + 8], 144 * k + 20 + 32 * p + 8 * t))
                        A.append(q4k_a(qa, qb, hh))
                        m0 = byte_perm(sms[g][3 if half else 2], 0, 0x1111 * jj)
                        m1 = byte_perm(sms[g + 8][3 if half else 2], 0, 0x1111 * jj)
                        Am.append([m0, m1, m0, m1])
                        col = 256 * k + 32 * j + 8 * t
                        B.append((u32(xb[g], col), u32(xb[g], col + 4)))
                    sc = np.array([(sms[r][1 if half else 0] >> (8 * jj)) & 0xFF for r in range(16)])
                    S += sc[:, None] * mma(32, A, B, a_signed=False)
                    M += mma(32, Am, B, a_signed=False)
                dm = np.array([np.frombuffer(bytes(w[r, 144 * k:144 * k + 4]), np.float16) for r in range(16)])
                got = dm[:, :1].astype(np.float64) * S - dm[:, 1:].astype(np.float64) * M
            else:
                h = half
                for u in range(2):
                    for s_ in range(4):
                        A, B = [], []
                        for lane in range(32):
                            g, t = G[lane], TQ[lane]
                            regs = []
                            for r in (w[g], w[g + 8]):
                                b = 210 * k
                                regs.append(q6k_a(u32(r, b + 64 * h + 16 * u + 4 * t),
                                                  u32(r, b + 64 * h + 32 + 16 * u + 4 * t),
                                                  u32(r, b + 128 + 32 * h + 16 * u + 4 * t), s_))
                            A.append(regs)
                            B.append((u32(xb[g], 256 * k + 128 * h + 32 * s_ + 16 * u + 4 * t),))
                        sc = np.array([int(np.int8(w[r, 210 * k + 192 + 8 * h + 2 * s_ + u])) for r in range(16)])
                        S += sc[:, None] * mma(16, A, B, a_signed=True)
                d = np.array([np.frombuffer(bytes(w[r, 210 * k + 208:210 * k + 210]), np.float16)[0] for r in range(16)])
                got = d.astype(np.float64)[:, None] * S
            want = want_w[:, c_lo:c_lo + 128] @ x[:, c_lo:c_lo + 128].astype(np.float64).T
            np.testing.assert_array_equal(got, want, err_msg=f"{fmt} super-block {k} group {half}")


# ---- gemv_rows_plan.cuh / gemv_rows.cuh bookkeeping, transcribed ------------------------------------------------
UNIT = {"Q4_K": 144, "Q6_K": 210, "Q8_0": 272, "Q5_0": 176}
BLOCK = {"Q4_K": 144, "Q6_K": 210, "Q8_0": 34, "Q5_0": 22}        # bytes of one ggml block
BLOCK_COLS = {"Q4_K": 256, "Q6_K": 256, "Q8_0": 32, "Q5_0": 32}
BLK32 = ("Q8_0", "Q5_0")                                          # formats whose chunks count 32-column blocks


def rows_ks(cols: int, gemv_rows: int) -> int:
    return max(gemv_rows, -(-(-(-cols // 256)) // 36))


def rows_stride(fmt: str, ks: int) -> int:
    b = ks * 144 if fmt == "Q4_K" else ((ks * UNIT[fmt] + 14 + 15) // 16) * 16
    while b % (64 if fmt == "Q4_K" else 32) != (32 if fmt == "Q4_K" else 16):
        b += 16
    return b


def rows_chunk(fmt: str, cols: int, ks: int, chunk: int) -> tuple[int, int, int, int]:
    """(byte offset in the row, bytes, first unit, units)"""
    if fmt in BLK32:
        nblk = cols // 32
        u0 = chunk * 8 * ks
        nu = min(8 * ks, nblk - u0)
        return BLOCK[fmt] * u0, BLOCK[fmt] * nu, u0, nu
    nsb = cols // 256
    u0 = chunk * ks
    nu = min(ks, nsb - u0)
    return BLOCK[fmt] * u0, BLOCK[fmt] * nu, u0, nu


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
@pytest.mark.parametrize("ks", [1, 2, 3, 8])
@pytest.mark.parametrize("base", [0, 2, 6, 14])
def test_staging_puts_each_row_chunk_inside_its_stride(fmt, ks, base):
    if fmt not in BLK32 and base % 16:
        pytest.skip("K-quant weights are 16-byte aligned (flashd.h)")
    for cols in ([256, 768, 2560, 8960] if fmt not in BLK32 else [32, 96, 800, 896, 1536, 4864, 8960]):
        row_bytes = cols // BLOCK_COLS[fmt] * BLOCK[fmt]
        C = -(-cols // (256 * ks))
        stride = rows_stride(fmt, ks)
        g = np.arange(2 * row_bytes * 17 + 64, dtype=np.int64) % 251   # global memory: byte values by address
        for chunk in range(C):
            off, nbytes, _, _ = rows_chunk(fmt, cols, ks, chunk)
            assert nbytes > 0
            slot = np.full(16 * stride, -1, np.int64)
            copies = []                                # (row, piece) of each cp.async of rows_stage_mat's lanes
            for lane in range(32):
                r = lane & 15
                total = ((base + r * row_bytes + off) & 15) + nbytes
                copies += [(r, pc) for pc in range(lane >> 4, -(-total // 16), 2)]
            assert len(set(copies)) == len(copies)
            for r, pc in copies:
                src = base + r * row_bytes + off
                head = src & 15
                left = head + nbytes - 16 * pc
                assert left > 0
                n = min(16, left)
                dst = r * stride + 16 * pc
                assert 16 * pc + n <= stride, f"{fmt} ks{ks} cols {cols}: row {r} spills into the next"
                slot[dst:dst + n] = g[src - head + 16 * pc:src - head + 16 * pc + n]
            for r in range(16):                        # what rows_item reads: row r's chunk at r * stride + head
                src = base + r * row_bytes + off
                head = src & 15
                np.testing.assert_array_equal(slot[r * stride + head:r * stride + head + nbytes], g[src:src + nbytes])
            if fmt == "Q4_K":
                assert (base + off) % 16 == 0            # the uint4 header loads need it


@pytest.mark.parametrize("cols", [32, 256, 800, 1536, 8960, 9216, 27648, 65536])
@pytest.mark.parametrize("gemv_rows", [1, 2, 8])
def test_chunks_cover_every_column_once(cols, gemv_rows):
    ks = rows_ks(cols, gemv_rows)
    C = -(-cols // (256 * ks))
    assert C <= 36 and ks <= 8
    for fmt in (list(BLK32) if cols % 256 else ["Q4_K", "Q6_K", "Q8_0", "Q5_0"]):
        covered = []
        for chunk in range(C):
            _, _, u0, nu = rows_chunk(fmt, cols, ks, chunk)
            covered += list(range(u0, u0 + nu))
        assert covered == list(range(cols // BLOCK_COLS[fmt]))


@pytest.mark.parametrize("ntt", [1, 2, 4])
def test_fold_threads_cover_each_output_once(ntt):
    seen = set()
    for o in range(ntt * 4 * 32):
        ln, kk = o & 31, (o >> 5) % (ntt * 4)
        row = (ln >> 2) + 8 * ((kk & 3) >> 1)
        xr = (kk >> 2) * 8 + 2 * (ln & 3) + (kk & 1)
        # the fragment element this thread reads was written by lane ln as acc[nt][e], nt = kk >> 2, e = kk & 3:
        # the C fragment's (row g + 8 (e >> 1), column 2t + (e & 1)) of N-tile nt
        assert row == G[ln] + 8 * ((kk & 3) >> 1) and xr == 8 * (kk >> 2) + 2 * TQ[ln] + (kk & 1)
        seen.add((row, xr))
    assert seen == {(r, x) for r in range(16) for x in range(8 * ntt)}


# ---- x's codes and scales (gemv_rows.cuh rows_quant_group / rows_store_scales, gemv_rows_item.cuh's reads) --------
def quantize_x_row(x: np.ndarray, fine: bool) -> tuple[np.ndarray, dict]:
    """The pre-pass / CTA copy of one x row, transcribed: warp grp takes columns 128 grp + 32 u + lane (u < nu); the
    codes rint(xn * (127 / m)), the scale m / 127, m = max |xn| over the group or (fine) over block u; lane 0 stores
    the scale at row grp, or 4 grp + u. Returns (codes, {scale row: (xd, how many times written)})."""
    cols = x.size
    q = np.zeros(cols, np.int64)
    scales: dict = {}
    for grp in range((cols + 127) // 128):
        nu = min(4, cols // 32 - 4 * grp)
        blocks = [x[128 * grp + 32 * u:128 * grp + 32 * u + 32].astype(np.float32) for u in range(nu)]
        ms = [np.float32(np.abs(b).max()) for b in blocks]
        if not fine:
            ms = [max(ms)] * nu
        for u, (b, m) in enumerate(zip(blocks, ms)):
            inv = np.float32(127.0) / m if m > 0 else np.float32(0.0)
            q[128 * grp + 32 * u:128 * grp + 32 * u + 32] = np.clip(np.rint(b * inv), -127, 127)
        for u in (range(nu) if fine else [0]):
            row = 4 * grp + u if fine else grp
            xd = np.float32(ms[u] / np.float32(127.0))
            scales[row] = (xd, scales.get(row, (0, 0))[1] + 1)
    return q, scales


@pytest.mark.parametrize("cols", [32, 96, 800, 896, 1536, 4864])
def test_x_scales_are_written_once_and_read_where_the_items_look(cols):
    """Every scale row is written exactly once (fine: one a 32-column block, cols / 32 rows; else one a 128-column
    group, ceil(cols / 128) -- gemv_rows_item.cuh rows_scale_rows), the items' lookups find the scale that quantized
    each column (rows_item_blk32: block blk0 + bl when fine, group (blk0 + bg) >> 2 otherwise; the K-quant items:
    group), and x' = xd q is within xd / 2 of x, so a fine scale is never coarser than its group's."""
    rng = np.random.default_rng(cols)
    x = rng.standard_normal(cols).astype(np.float32) * rng.uniform(0.1, 30.0, cols // 32).repeat(32).astype(np.float32)
    coarse_err = None
    for fine in (False, True):
        q, scales = quantize_x_row(x, fine)
        n_rows = cols // 32 if fine else (cols + 127) // 128
        assert sorted(scales) == list(range(n_rows)) and all(c == 1 for _, c in scales.values())
        blk = np.arange(cols) // 32
        look = blk if fine else blk >> 2
        xd = np.array([scales[r][0] for r in look], np.float64)
        err = np.abs(xd * q - x.astype(np.float64))
        assert np.all(err <= xd / 2 * (1 + 1e-6) + 1e-30)
        bound = xd / 2
        if fine:
            assert np.all(bound <= coarse_err + 1e-30)
        coarse_err = bound
