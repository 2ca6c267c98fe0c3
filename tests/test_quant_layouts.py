"""CPU emulation of the device-side GGUF decoders (native/cuda/quant.cuh) and of gemv's per-lane
indexing (native/cuda/gemv.cu row_dot), checked against gguf.quants.dequantize.

Each `Emu*` class below is a line-by-line numpy transcription of the matching `Fmt<QT>` in
quant.cuh: which bytes a lane loads from the staged shared-memory image (including the funnel shifts
for 2-byte-aligned formats), which nibbles/bits it combines, which scale it applies, which columns
its runs cover, and where it reads the activations in shared memory. The tests rebuild whole rows
from the per-lane pieces, exactly as the kernels' lanes would see them, and require bit equality
with gguf's float32 dequantization (every weight is a*q + b with a*q exact in float32, so no
rounding freedom is left). They also check the activation layouts: the per-lane x addresses equal
the layout function, advance affinely, and give conflict-free float4 reads per quarter-warp.
No GPU is needed.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

MAGIC = np.float32(8388608.0)   # 2^23
XL_PLAIN, XL_S32, XL_PAD64 = 0, 1, 2


# ---- the device helpers -----------------------------------------------------------------------------
def x_phys(layout: int, e: int) -> int:
    if layout == XL_PAD64:
        return e + 4 * (e >> 6)
    if layout == XL_S32:
        return e ^ ((e >> 1) & 0x10)
    return e


def x_row_floats(layout: int, cols: int) -> int:
    c = (cols + 63) & ~63
    return c + c // 16 if layout == XL_PAD64 else c


def lds_words(smem: np.ndarray, addr: int, n: int, align: int) -> list[int]:
    """quant.cuh lds_words: n little-endian u32 words at byte address addr of shared memory."""
    if align >= 4:
        assert addr % 4 == 0, "the format promised 4-byte alignment"
        return [int.from_bytes(smem[addr + 4 * k: addr + 4 * k + 4].tobytes(), "little") for k in range(n)]
    assert addr % 2 == 0, "every block is at least 2-byte aligned"
    mis = addr & 3
    base = addr - mis
    t = [int.from_bytes(smem[base + 4 * k: base + 4 * k + 4].tobytes(), "little") for k in range(n + 1)]
    # __funnelshift_r(lo, hi, s) = low 32 bits of (hi:lo) >> s
    return [(((t[k + 1] << 32) | t[k]) >> (8 * mis)) & 0xFFFFFFFF for k in range(n)]


def f16_at(smem: np.ndarray, addr: int) -> np.float32:
    assert addr % 2 == 0
    return np.float32(smem[addr: addr + 2].view(np.float16)[0])


def u32_f32(u: int) -> np.float32:
    return np.array([u & 0xFFFFFFFF], np.uint32).view(np.float32)[0]


def code_f(w: int, k: int, bias: np.float32) -> np.float32:
    """__byte_perm(w, 0x4B000000, 0x7650 | k) as a float, minus bias (float32 arithmetic)."""
    return np.float32(u32_f32(0x4B000000 | ((w >> (8 * k)) & 0xFF)) - np.float32(bias))


def spread4_to_bit4(x: int) -> int:
    return ((x * 0x02040810) & 0xFFFFFFFF) & 0x10101010


def half2(w: int) -> tuple[np.float32, np.float32]:
    h = np.array([w & 0xFFFF, w >> 16], np.uint16).view(np.float16).astype(np.float32)
    return h[0], h[1]


# ---- the formats (mirror Fmt<QT> in quant.cuh) -------------------------------------------------------
class EmuF32:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, HAS_MIN, IS_FLOAT = T.F32, 4, 16, 1, 1, 1, 4, XL_PLAIN, False, True

    @staticmethod
    def load(smem, blk, j):
        return {"w": lds_words(smem, blk, 4, EmuF32.ALIGN)}

    @staticmethod
    def mask(raw, n_valid):
        raw["w"] = [w if k < n_valid else 0 for k, w in enumerate(raw["w"])]

    @staticmethod
    def params(raw, j):
        return [np.float32(1)], [np.float32(-0.0)]

    @staticmethod
    def codes(raw, j, run):
        return [u32_f32(w) for w in raw["w"]]

    col = staticmethod(lambda j, run: 0)
    xblk = staticmethod(lambda blk: 4 * blk)
    xlane = staticmethod(lambda j, parity: 0)
    xrun = staticmethod(lambda j, parity, run: 0)


class EmuF16:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, HAS_MIN, IS_FLOAT = T.F16, 8, 16, 1, 2, 1, 2, XL_PLAIN, False, True

    @classmethod
    def load(cls, smem, blk, j):
        return {"w": lds_words(smem, blk, 4, cls.ALIGN)}

    @staticmethod
    def mask(raw, n_valid):
        out = []
        for k, w in enumerate(raw["w"]):
            keep = (0x0000FFFF if 2 * k < n_valid else 0) | (0xFFFF0000 if 2 * k + 1 < n_valid else 0)
            out.append(w & keep)
        raw["w"] = out

    @staticmethod
    def params(raw, j):
        return [np.float32(1)], [np.float32(-0.0)]

    @staticmethod
    def codes(raw, j, run):
        lo, hi = raw["w"][2 * run], raw["w"][2 * run + 1]
        return [*half2(lo), *half2(hi)]

    col = staticmethod(lambda j, run: 4 * run)
    xblk = staticmethod(lambda blk: 8 * blk)
    xlane = staticmethod(lambda j, parity: 0)
    xrun = staticmethod(lambda j, parity, run: 4 * run)


class EmuBF16(EmuF16):
    qtype = T.BF16

    @staticmethod
    def codes(raw, j, run):
        lo, hi = raw["w"][2 * run], raw["w"][2 * run + 1]
        return [u32_f32(lo << 16), u32_f32(lo & 0xFFFF0000), u32_f32(hi << 16), u32_f32(hi & 0xFFFF0000)]


class Emu32Block:   # shared by the 32-element formats
    BE, LPB, RUNS, PARTS, HAS_MIN, IS_FLOAT = 32, 4, 2, 1, False, False
    XL = XL_S32
    col = staticmethod(lambda j, run: 16 * run + 4 * j)
    xblk = staticmethod(lambda blk: 32 * blk)
    xlane = staticmethod(lambda j, parity: 4 * j)
    xrun = staticmethod(lambda j, parity, run: 16 * (run ^ parity))

    @staticmethod
    def mask(raw, n_valid):
        pass


class EmuQ4_0(Emu32Block):
    qtype, BB, ALIGN = T.Q4_0, 18, 2

    @classmethod
    def load(cls, smem, blk, j):
        return {"qs": lds_words(smem, blk + 2 + 4 * j, 1, cls.ALIGN)[0], "d": f16_at(smem, blk)}

    @staticmethod
    def params(raw, j):
        return [raw["d"]], [np.float32(-0.0)]

    @staticmethod
    def codes(raw, j, run):
        nib = (raw["qs"] >> 4 if run else raw["qs"]) & 0x0F0F0F0F
        return [code_f(nib, i, MAGIC + 8) for i in range(4)]


class EmuQ4_1(Emu32Block):
    qtype, BB, ALIGN = T.Q4_1, 20, 4

    @classmethod
    def load(cls, smem, blk, j):
        d, m = half2(lds_words(smem, blk, 1, cls.ALIGN)[0])
        return {"d": d, "m": m, "qs": lds_words(smem, blk + 4 + 4 * j, 1, cls.ALIGN)[0]}

    @staticmethod
    def params(raw, j):
        return [np.float32(1)], [np.float32(-0.0)]

    @staticmethod
    def codes(raw, j, run):
        nib = (raw["qs"] >> 4 if run else raw["qs"]) & 0x0F0F0F0F
        # fmaf(d, code, m): d*code is exact, so float32 (d*code) + m rounds the same way
        return [np.float32(raw["d"] * code_f(nib, i, MAGIC) + raw["m"]) for i in range(4)]


class EmuQ5_0(Emu32Block):
    qtype, BB, ALIGN = T.Q5_0, 22, 2

    @classmethod
    def load(cls, smem, blk, j):
        return {"qh": lds_words(smem, blk + 2, 1, cls.ALIGN)[0],
                "qs": lds_words(smem, blk + 6 + 4 * j, 1, cls.ALIGN)[0], "d": f16_at(smem, blk)}

    @staticmethod
    def params(raw, j):
        return [raw["d"]], [np.float32(-0.0)]

    @staticmethod
    def codes(raw, j, run):
        nib = (raw["qs"] >> 4 if run else raw["qs"]) & 0x0F0F0F0F
        code = nib | spread4_to_bit4((raw["qh"] >> (16 * run + 4 * j)) & 0xF)
        return [code_f(code, i, MAGIC + 16) for i in range(4)]


class EmuQ8_0:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, HAS_MIN, IS_FLOAT = T.Q8_0, 32, 34, 8, 1, 1, 2, XL_PLAIN, False, False
    col = staticmethod(lambda j, run: 4 * j)
    xblk = staticmethod(lambda blk: 32 * blk)
    xlane = staticmethod(lambda j, parity: 4 * j)
    xrun = staticmethod(lambda j, parity, run: 0)

    @classmethod
    def load(cls, smem, blk, j):
        return {"qs": lds_words(smem, blk + 2 + 4 * j, 1, cls.ALIGN)[0], "d": f16_at(smem, blk)}

    @staticmethod
    def mask(raw, n_valid):
        pass

    @staticmethod
    def params(raw, j):
        return [raw["d"]], [np.float32(-0.0)]

    @staticmethod
    def codes(raw, j, run):
        u = raw["qs"] ^ 0x80808080
        return [code_f(u, i, MAGIC + 128) for i in range(4)]


def kquant_params(h, c):
    """quant.cuh kquant_params: lane c's (scale, min) pairs for sub-blocks 2c, 2c+1, branch-free."""
    d, dmin = half2(h[0])
    hi = c >= 2
    sh = 16 * (c & 1)
    mask_lo, mask_hi = (0x0F0F, 0x3030) if hi else (0x3F3F, 0)
    sc = (((h[3] if hi else h[1]) >> sh) & mask_lo) | ((h[1] >> (sh + 2)) & mask_hi)
    mn = (((h[3] >> 4 if hi else h[2]) >> sh) & mask_lo) | ((h[2] >> (sh + 2)) & mask_hi)
    a = [np.float32(d * np.float32(sc & 0xFF)), np.float32(d * np.float32(sc >> 8))]
    b = [np.float32(-(dmin * np.float32(mn & 0xFF))), np.float32(-(dmin * np.float32(mn >> 8)))]
    return a, b


class EmuQ4_K:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, HAS_MIN, IS_FLOAT = T.Q4_K, 256, 144, 4, 16, 2, 16, XL_PAD64, True, False
    col = staticmethod(lambda c, run: 64 * c + 32 * (run >> 3) + 4 * (run & 7))
    xblk = staticmethod(lambda blk: 272 * blk)
    xlane = staticmethod(lambda c, parity: 68 * c)
    xrun = staticmethod(lambda c, parity, run: 32 * (run >> 3) + 4 * (run & 7))
    sub = staticmethod(lambda blk, c, part: 8 * blk + 2 * c + part)

    @classmethod
    def load(cls, smem, blk, c):
        assert blk % 16 == 0, "LDS.128 needs 16-byte aligned blocks"
        return {"h": lds_words(smem, blk, 4, 16), "qs": lds_words(smem, blk + 16 + 32 * c, 8, 16)}

    @staticmethod
    def mask(raw, n_valid):
        pass

    @staticmethod
    def params(raw, c):
        return kquant_params(raw["h"], c)

    @staticmethod
    def codes(raw, c, run):
        w = raw["qs"][run & 7]
        nib = (w >> 4 if run >= 8 else w) & 0x0F0F0F0F
        return [code_f(nib, i, MAGIC) for i in range(4)]


class EmuQ5_K(EmuQ4_K):
    qtype, BB = T.Q5_K, 176

    @classmethod
    def load(cls, smem, blk, c):
        assert blk % 16 == 0
        return {"h": lds_words(smem, blk, 4, 16), "qh": lds_words(smem, blk + 16, 8, 16),
                "qs": lds_words(smem, blk + 48 + 32 * c, 8, 16)}

    @staticmethod
    def codes(raw, c, run):
        k, s = run & 7, run >> 3
        nib = (raw["qs"][k] >> 4 if s else raw["qs"][k]) & 0x0F0F0F0F
        hb = ((raw["qh"][k] >> (2 * c + s)) & 0x01010101) << 4
        return [code_f(nib | hb, i, MAGIC) for i in range(4)]


class EmuQ6_K:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, HAS_MIN, IS_FLOAT = T.Q6_K, 256, 210, 4, 16, 4, 2, XL_PAD64, False, False
    col = staticmethod(lambda j, run: 128 * (j >> 1) + 32 * (run >> 2) + 16 * (j & 1) + 4 * (run & 3))
    xblk = staticmethod(lambda blk: 272 * blk)
    xlane = staticmethod(lambda j, parity: 136 * (j >> 1) + 16 * (j & 1))
    xrun = staticmethod(lambda j, parity, run: 32 * (run >> 2) + 4 * (run >> 3) + 4 * (run & 3))

    @classmethod
    def load(cls, smem, blk, j):
        H, lh = j >> 1, j & 1
        return {"ql0": lds_words(smem, blk + 64 * H + 16 * lh, 4, 2),
                "ql1": lds_words(smem, blk + 64 * H + 32 + 16 * lh, 4, 2),
                "qh": lds_words(smem, blk + 128 + 32 * H + 16 * lh, 4, 2),
                "sc": lds_words(smem, blk + 192 + 8 * H, 2, 2),
                "d": f16_at(smem, blk + 208)}

    @staticmethod
    def mask(raw, n_valid):
        pass

    @staticmethod
    def params(raw, j):
        lh = j & 1
        a, b = [], []
        for g in range(4):
            w = raw["sc"][g >> 1]
            byte = (w >> (8 * (lh + 2 * (g & 1)))) & 0xFF   # (int32)(w << (24 - 8*pos)) >> 24
            s = byte - 256 if byte >= 128 else byte
            a.append(np.float32(raw["d"] * np.float32(s)))
            b.append(np.float32(-0.0))
        return a, b

    @staticmethod
    def codes(raw, j, run):
        g, k = run >> 2, run & 3
        l = raw["ql1"][k] if g & 1 else raw["ql0"][k]
        nib = (l >> 4 if g >> 1 else l) & 0x0F0F0F0F
        code = nib | (((raw["qh"][k] >> (2 * g)) & 0x03030303) << 4)
        return [code_f(code, i, MAGIC + 32) for i in range(4)]


FORMATS = [EmuF32, EmuF16, EmuBF16, EmuQ4_0, EmuQ4_1, EmuQ5_0, EmuQ8_0, EmuQ4_K, EmuQ5_K, EmuQ6_K]


# ---- random valid tensors ----------------------------------------------------------------------------
def random_tensor(rng, fmt, rows: int, cols: int) -> np.ndarray:
    """(rows, row_bytes) uint8: random codes/scales with sane f16 d (and dmin / m)."""
    if fmt.IS_FLOAT:
        v = rng.standard_normal((rows, cols)).astype(np.float32)
        if fmt.qtype == T.F32:
            return v.view(np.uint8).reshape(rows, -1)
        if fmt.qtype == T.F16:
            return v.astype(np.float16).view(np.uint8).reshape(rows, -1)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    block_size, type_size = GGML_QUANT_SIZES[fmt.qtype]
    nb = cols // block_size
    data = rng.integers(0, 256, (rows, nb, type_size), dtype=np.uint8)

    def f16s(lo, hi):
        mag = np.exp(rng.uniform(np.log(lo), np.log(hi), (rows, nb))).astype(np.float32)
        sign = np.where(rng.random((rows, nb)) < 0.5, -1, 1).astype(np.float32)
        return (mag * sign).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)

    if fmt.qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        data[..., 0:2] = f16s(1e-4, 1e-1)
    elif fmt.qtype == T.Q4_1:
        data[..., 0:2] = f16s(1e-4, 1e-1)
        data[..., 2:4] = f16s(1e-4, 1.0)
    elif fmt.qtype in (T.Q4_K, T.Q5_K):
        data[..., 0:2] = f16s(1e-5, 1e-2)
        data[..., 2:4] = f16s(1e-5, 1e-2)
    elif fmt.qtype == T.Q6_K:
        data[..., 208:210] = f16s(1e-5, 1e-2)
    return data.reshape(rows, nb * type_size)


def row_bytes(fmt, cols):
    return cols * (fmt.BB // fmt.BE) if fmt.IS_FLOAT else cols // fmt.BE * fmt.BB


def pieces_per_row(fmt, cols):
    return -(-cols // fmt.BE) if fmt.IS_FLOAT else cols // fmt.BE * fmt.LPB


def allowed_lprs(fmt):
    """gemv.cu choose_lpr's candidates."""
    out = []
    for lpr in (4, 8, 16, 32):
        if lpr < fmt.LPB or (fmt.XL == XL_S32 and lpr < 2 * fmt.LPB):
            continue
        out.append(lpr)
    return out


def stage(raw: np.ndarray, src_mod16: int) -> tuple[np.ndarray, int]:
    """quant.cuh warp_stage: the staged bytes land at buf + (src & 15); 16 bytes of slack after."""
    n = raw.size
    smem = np.full(((src_mod16 + n + 15) // 16 * 16 + 16,), 0xA5, np.uint8)   # stale bytes, not zeros
    smem[src_mod16: src_mod16 + n] = raw.reshape(-1)
    # the zero-filled tail of the last 16-byte chunk
    smem[src_mod16 + n: (src_mod16 + n + 15) // 16 * 16] = 0
    return smem, src_mod16


# ---- emulation of gemv's lanes ------------------------------------------------------------------------
def emulate_rows(fmt, data: np.ndarray, cols: int, lpr: int, base_mod16: int, x: np.ndarray | None = None):
    """Rebuild the weights (rows, cols) from the pieces the lanes of gemv.cu row_dot decode, with G =
    32 / lpr rows per staged step, and (if x is given) the lanes' factored dot products
    a * sum(q x) + b * xsum. Also checks every x address against the layout."""
    rows = data.shape[0]
    rb = row_bytes(fmt, cols)
    G = 32 // lpr
    P = pieces_per_row(fmt, cols)
    out = np.full((rows, cols), np.nan, np.float32)
    dots = None
    if x is not None:
        xs = np.zeros(x_row_floats(fmt.XL, cols), np.float32)
        for c in range(cols):
            xs[x_phys(fmt.XL, c)] = x[c]
        xsum = np.array([x[32 * s: 32 * s + 32].sum(dtype=np.float32) for s in range(cols // 32)], np.float32)
        dots = np.zeros(rows, np.float64)
    for r0 in range(0, rows, G):
        n_rows = min(G, rows - r0)
        src_mod16 = (base_mod16 + r0 * rb) % 16
        smem, head = stage(data[r0: r0 + n_rows], src_mod16)
        for g in range(n_rows):
            wrow = head + g * rb
            for t in range(lpr):
                j = t % fmt.LPB
                blk = t // fmt.LPB
                blk_step = lpr // fmt.LPB
                parity = blk & 1
                wp = wrow + blk * fmt.BB
                xp = fmt.xblk(blk) + fmt.xlane(j, parity)
                x_step = fmt.xblk(blk_step)
                acc = np.float32(0)
                for p in range(t, P, lpr):
                    raw = fmt.load(smem, wp, j)
                    if fmt.IS_FLOAT:
                        fmt.mask(raw, cols - blk * fmt.BE)
                    pa, pb = fmt.params(raw, j)
                    rpp = fmt.RUNS // fmt.PARTS
                    for part in range(fmt.PARTS):
                        dot = np.float32(0)
                        for rr in range(rpp):
                            run = part * rpp + rr
                            q = fmt.codes(raw, j, run)
                            c0 = blk * fmt.BE + fmt.col(j, run)
                            xo = xp + fmt.xrun(j, parity, run)
                            for i in range(4):
                                c = c0 + i
                                assert xo + i == x_phys(fmt.XL, c), (fmt.__name__, lpr, t, p, run, i)
                                # dequant: fmaf(a, q, b), a*q exact
                                w = np.float32(np.float32(pa[part] * q[i]) + pb[part])
                                if c < cols:
                                    assert np.isnan(out[r0 + g, c]), "two lanes wrote one weight"
                                    out[r0 + g, c] = w
                                else:
                                    assert fmt.IS_FLOAT and q[i] == 0, "tail weights are masked to 0"
                                if x is not None:
                                    dot = np.float32(dot + np.float32(q[i] * xs[xo + i]))
                        if x is not None:
                            acc = np.float32(acc + np.float32(pa[part] * dot))
                            if fmt.HAS_MIN:
                                acc = np.float32(acc + pb[part] * xsum[fmt.sub(blk, j, part)])
                    blk += blk_step
                    wp += blk_step * fmt.BB
                    xp += x_step
                if dots is not None:
                    dots[r0 + g] += acc
    return out, dots


def _cols_for(fmt, n_blocks):
    return n_blocks * fmt.BE if not fmt.IS_FLOAT else n_blocks


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.qtype.name)
def test_lanes_rebuild_gguf_dequantize_exactly(fmt):
    rng = np.random.default_rng()
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
    """The factored per-part sums (a * sum q x + b * sum x) gemv computes, vs float64 W @ x.
    Tolerance: float32 accumulation over <= 3 blocks: 1e-5 of sum |W||x|."""
    rng = np.random.default_rng()
    cols = _cols_for(fmt, 3) if not fmt.IS_FLOAT else 21
    rows = 3
    data = random_tensor(rng, fmt, rows, cols)
    w = dequantize(data, fmt.qtype).reshape(rows, cols).astype(np.float64)
    x = rng.standard_normal(cols).astype(np.float32)
    for lpr in allowed_lprs(fmt):
        _, dots = emulate_rows(fmt, data, cols, lpr, 0, x)
        want = w @ x.astype(np.float64)
        scale = np.abs(w) @ np.abs(x.astype(np.float64))
        assert np.all(np.abs(dots - want) <= 1e-5 * scale + 1e-30), (fmt.qtype.name, lpr, dots, want)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.qtype.name)
def test_x_reads_are_bank_conflict_free(fmt):
    """For each float4 read of xn (one run of every lane of a warp), the distinct addresses of a
    quarter-warp (8 lanes: one LDS.128 wavefront) must fall in distinct 16-byte bank quads. Q6_K's
    lane map and F16/BF16's 8-column pieces admit 2-way conflicts (documented in quant.cuh)."""
    allowed_ways = 2 if fmt.qtype in (T.Q6_K, T.F16, T.BF16) else 1
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
    for layout in (XL_PLAIN, XL_S32, XL_PAD64):
        for cols in (1, 31, 32, 64, 896, 1536, 8960):
            pad = (cols + 63) & ~63
            phys = [x_phys(layout, e) for e in range(pad)]
            assert len(set(phys)) == pad, "a layout is a bijection"
            assert max(phys) < x_row_floats(layout, cols)


def test_spread4_matches_bitwise_definition():
    for x in range(16):
        want = sum(((x >> i) & 1) << (8 * i + 4) for i in range(4))
        assert spread4_to_bit4(x) == want


def test_funnel_loads_match_unaligned_reads():
    rng = np.random.default_rng()
    smem = rng.integers(0, 256, 64, dtype=np.uint8)
    for addr in range(0, 40, 2):
        got = lds_words(smem, addr, 3, 2)
        want = [int.from_bytes(smem[addr + 4 * k: addr + 4 * k + 4].tobytes(), "little") for k in range(3)]
        assert got == want
