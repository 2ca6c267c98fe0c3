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
X_SCALE_LOG2 = 80                # gemv stages xn * 2^80 (quant.cuh)
XL_PAD32, XL_PAD64 = 0, 1


# ---- the device helpers -----------------------------------------------------------------------------
def x_phys(layout: int, e: int) -> int:
    return e + 4 * (e >> 6) if layout == XL_PAD64 else e + 4 * (e >> 5)


def x_row_floats(layout: int, cols: int) -> int:
    c = (cols + 63) & ~63
    return c + c // 16 if layout == XL_PAD64 else c + c // 8


def lds_words(smem: np.ndarray, addr: int, n: int, align: int) -> list[int]:
    """quant.cuh lds_words: n little-endian u32 words at byte address addr of shared memory."""
    if align >= 4:
        assert addr % align == 0, f"the format promised {align}-byte alignment"
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


def exp2i(e: int) -> np.float32:
    return u32_f32((127 + e) << 23)


def exact_codes(w: int, shift: int, mask: int, offset: int) -> list[np.float32]:
    """quant.cuh exact_codes: PRMT each code byte into 0x4B0000cc, minus 2^23 + offset (float32)."""
    c = (w >> shift) & (mask * 0x01010101)
    return [np.float32(u32_f32(0x4B000000 | ((c >> (8 * i)) & 0xFF)) - np.float32(MAGIC + np.float32(offset)))
            for i in range(4)]


def scaled_codes(w: int, shift: int, mask: int) -> list[np.float32]:
    """quant.cuh scaled_codes: one AND per code; the patterns (< 2^24) read as float32 are exactly
    code * 2^(8i + shift - 149) (byte 3 first moved down to byte 2)."""
    m = mask << shift
    out = [u32_f32(w & m), u32_f32(w & (m << 8)), u32_f32(w & (m << 16)), u32_f32((w >> 8) & (m << 16))]
    for i, v in enumerate(out):   # the property the kernel relies on
        code = (w >> (8 * i + shift)) & mask
        assert v == np.float32(code) * np.float32(2.0 ** (8 * min(i, 2) + shift - 149))
    return out


def class_scale(cls: int, shift: int) -> np.float32:
    return exp2i(149 - 8 * cls - shift - X_SCALE_LOG2)


def spread4_to_bit4(x: int) -> int:
    return ((x * 0x02040810) & 0xFFFFFFFF) & 0x10101010


def half2(w: int) -> tuple[np.float32, np.float32]:
    h = np.array([w & 0xFFFF, w >> 16], np.uint16).view(np.float16).astype(np.float32)
    return h[0], h[1]


# ---- the formats (mirror Fmt<QT> in quant.cuh) -------------------------------------------------------
class EmuF32:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, MIN_LPR, IS_FLOAT = T.F32, 4, 16, 1, 1, 1, 4, XL_PAD32, 8, True

    @classmethod
    def load(cls, smem, blk, j, a16=False):
        return {"w": lds_words(smem, blk, 4, 16 if a16 else cls.ALIGN)}

    @staticmethod
    def mask(raw, n_valid):
        raw["w"] = [w if k < n_valid else 0 for k, w in enumerate(raw["w"])]

    @staticmethod
    def params(raw, j):
        return [np.float32(1)], [np.float32(-0.0)]

    @staticmethod
    def floats(raw, run):
        return [u32_f32(w) for w in raw["w"]]

    col = staticmethod(lambda j, run: 0)
    xblk = staticmethod(lambda blk: 4 * blk + 4 * (blk >> 3))
    xlane = staticmethod(lambda j: 0)
    xrun = staticmethod(lambda run: 0)


class EmuF16:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, MIN_LPR, IS_FLOAT = T.F16, 8, 16, 1, 2, 1, 2, XL_PAD32, 8, True

    @classmethod
    def load(cls, smem, blk, j, a16=False):
        return {"w": lds_words(smem, blk, 4, 16 if a16 else cls.ALIGN)}

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
    def floats(raw, run):
        lo, hi = raw["w"][2 * run], raw["w"][2 * run + 1]
        return [*half2(lo), *half2(hi)]

    col = staticmethod(lambda j, run: 4 * run)
    xblk = staticmethod(lambda blk: 8 * blk + 4 * (blk >> 2))
    xlane = staticmethod(lambda j: 0)
    xrun = staticmethod(lambda run: 4 * run)


class EmuBF16(EmuF16):
    qtype = T.BF16

    @staticmethod
    def floats(raw, run):
        lo, hi = raw["w"][2 * run], raw["w"][2 * run + 1]
        return [u32_f32(lo << 16), u32_f32(lo & 0xFFFF0000), u32_f32(hi << 16), u32_f32(hi & 0xFFFF0000)]


class EmuBlock32:   # shared by the 32-element formats: one lane per block, runs = columns 4r
    BE, LPB, RUNS, XL, MIN_LPR, IS_FLOAT = 32, 1, 8, XL_PAD32, 4, False
    col = staticmethod(lambda j, run: 4 * run)
    xblk = staticmethod(lambda blk: 36 * blk)
    xlane = staticmethod(lambda j: 0)
    xrun = staticmethod(lambda run: 4 * run)


class EmuQ4_0(EmuBlock32):
    qtype, BB, PARTS, ALIGN, PART_COLS, OFFSET, CODE_MASK = T.Q4_0, 18, 2, 2, 16, 8, 0xF

    @classmethod
    def load(cls, smem, blk, j, a16=False):
        return {"qs": lds_words(smem, blk + 2, 4, cls.ALIGN), "d": f16_at(smem, blk)}

    @staticmethod
    def params(raw, j):
        return [raw["d"]] * 2, [np.float32(-0.0)] * 2

    code_word = staticmethod(lambda raw, j, run: raw["qs"][run & 3])
    part_shift = staticmethod(lambda part: 4 * part)
    part_group = staticmethod(lambda blk, j, part: 2 * blk + part)


class EmuQ4_1(EmuBlock32):
    qtype, BB, PARTS, ALIGN, PART_COLS, OFFSET, CODE_MASK = T.Q4_1, 20, 2, 4, 16, 0, 0xF

    @classmethod
    def load(cls, smem, blk, j, a16=False):
        d, m = half2(lds_words(smem, blk, 1, cls.ALIGN)[0])
        return {"d": d, "m": m, "qs": lds_words(smem, blk + 4, 4, cls.ALIGN)}

    @staticmethod
    def params(raw, j):
        return [raw["d"]] * 2, [raw["m"]] * 2

    code_word = staticmethod(lambda raw, j, run: raw["qs"][run & 3])
    part_shift = staticmethod(lambda part: 4 * part)
    part_group = staticmethod(lambda blk, j, part: 2 * blk + part)


class EmuQ5_0(EmuBlock32):
    qtype, BB, PARTS, ALIGN, PART_COLS, OFFSET, CODE_MASK = T.Q5_0, 22, 1, 2, 32, 16, 0x1F

    @classmethod
    def load(cls, smem, blk, j, a16=False):
        return {"qh": lds_words(smem, blk + 2, 1, cls.ALIGN)[0], "qs": lds_words(smem, blk + 6, 4, cls.ALIGN),
                "d": f16_at(smem, blk)}

    @staticmethod
    def params(raw, j):
        return [raw["d"]], [np.float32(-0.0)]

    @staticmethod
    def code_word(raw, j, run):
        w = raw["qs"][run & 3]
        nib = (w >> 4 if run >= 4 else w) & 0x0F0F0F0F
        return nib | spread4_to_bit4((raw["qh"] >> (4 * run)) & 0xF)

    part_shift = staticmethod(lambda part: 0)
    part_group = staticmethod(lambda blk, j, part: blk)


class EmuQ8_0(EmuBlock32):
    qtype, BB, PARTS, ALIGN, PART_COLS, OFFSET, CODE_MASK = T.Q8_0, 34, 1, 2, 32, 128, 0xFF

    @classmethod
    def load(cls, smem, blk, j, a16=False):
        return {"qs": lds_words(smem, blk + 2, 8, cls.ALIGN), "d": f16_at(smem, blk)}

    @staticmethod
    def params(raw, j):
        return [raw["d"]], [np.float32(-0.0)]

    code_word = staticmethod(lambda raw, j, run: raw["qs"][run] ^ 0x80808080)
    part_shift = staticmethod(lambda part: 0)
    part_group = staticmethod(lambda blk, j, part: blk)


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
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, MIN_LPR, IS_FLOAT = T.Q4_K, 256, 144, 4, 16, 2, 16, XL_PAD64, 4, False
    PART_COLS, OFFSET, CODE_MASK = 32, 0, 0xF
    col = staticmethod(lambda c, run: 64 * c + 32 * (run >> 3) + 4 * (run & 7))
    xblk = staticmethod(lambda blk: 272 * blk)
    xlane = staticmethod(lambda c: 68 * c)
    xrun = staticmethod(lambda run: 32 * (run >> 3) + 4 * (run & 7))
    part_shift = staticmethod(lambda part: 4 * part)
    part_group = staticmethod(lambda blk, c, part: 8 * blk + 2 * c + part)

    @classmethod
    def load(cls, smem, blk, c, a16=False):
        assert blk % 16 == 0, "LDS.128 needs 16-byte aligned blocks"
        return {"h": lds_words(smem, blk, 4, 16), "qs": lds_words(smem, blk + 16 + 32 * c, 8, 16)}

    @staticmethod
    def params(raw, c):
        return kquant_params(raw["h"], c)

    code_word = staticmethod(lambda raw, c, run: raw["qs"][run & 7])


class EmuQ5_K(EmuQ4_K):
    qtype, BB, CODE_MASK = T.Q5_K, 176, 0x1F
    part_shift = staticmethod(lambda part: 0)

    @classmethod
    def load(cls, smem, blk, c, a16=False):
        assert blk % 16 == 0
        return {"h": lds_words(smem, blk, 4, 16), "qh": lds_words(smem, blk + 16, 8, 16),
                "qs": lds_words(smem, blk + 48 + 32 * c, 8, 16)}

    @staticmethod
    def code_word(raw, c, run):
        k, s = run & 7, run >> 3
        nib = (raw["qs"][k] >> 4 if s else raw["qs"][k]) & 0x0F0F0F0F
        return nib | (((raw["qh"][k] >> (2 * c + s)) & 0x01010101) << 4)


class EmuQ6_K:
    qtype, BE, BB, LPB, RUNS, PARTS, ALIGN, XL, MIN_LPR, IS_FLOAT = T.Q6_K, 256, 210, 4, 16, 4, 2, XL_PAD64, 4, False
    PART_COLS, OFFSET, CODE_MASK = 16, 32, 0x3F
    col = staticmethod(lambda j, run: 128 * (j >> 1) + 32 * (run >> 2) + 16 * (j & 1) + 4 * (run & 3))
    xblk = staticmethod(lambda blk: 272 * blk)
    xlane = staticmethod(lambda j: 136 * (j >> 1) + 16 * (j & 1))
    xrun = staticmethod(lambda run: 32 * (run >> 2) + 4 * (run >> 3) + 4 * (run & 3))
    part_shift = staticmethod(lambda part: 0)
    part_group = staticmethod(lambda blk, j, part: 16 * blk + 8 * (j >> 1) + 2 * part + (j & 1))

    @classmethod
    def load(cls, smem, blk, j, a16=False):
        H, lh = j >> 1, j & 1
        return {"ql0": lds_words(smem, blk + 64 * H + 16 * lh, 4, 2),
                "ql1": lds_words(smem, blk + 64 * H + 32 + 16 * lh, 4, 2),
                "qh": lds_words(smem, blk + 128 + 32 * H + 16 * lh, 4, 2),
                "sc": lds_words(smem, blk + 192 + 8 * H, 2, 2),
                "d": f16_at(smem, blk + 208)}

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
    def code_word(raw, j, run):
        g, k = run >> 2, run & 3
        l = raw["ql1"][k] if g & 1 else raw["ql0"][k]
        nib = (l >> 4 if g >> 1 else l) & 0x0F0F0F0F
        return nib | (((raw["qh"][k] >> (2 * g)) & 0x03030303) << 4)


FORMATS = [EmuF32, EmuF16, EmuBF16, EmuQ4_0, EmuQ4_1, EmuQ5_0, EmuQ8_0, EmuQ4_K, EmuQ5_K, EmuQ6_K]


def decode_run(fmt, raw, j, run, pa, pb):
    """quant.cuh decode_run (dequant/embed): the 4 weights of a run, exact."""
    if fmt.IS_FLOAT:
        return fmt.floats(raw, run)
    part = run // (fmt.RUNS // fmt.PARTS)
    q = exact_codes(fmt.code_word(raw, j, run), fmt.part_shift(part), fmt.CODE_MASK, fmt.OFFSET)
    # fmaf(a, q, b): a*q is exact in float32, so (a*q) + b rounds exactly like the fma
    return [np.float32(np.float32(pa[part] * qi) + pb[part]) for qi in q]


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
    return [lpr for lpr in (4, 8, 16, 32) if lpr >= fmt.LPB and lpr >= fmt.MIN_LPR]


def stage(raw: np.ndarray, src_mod16: int) -> tuple[np.ndarray, int]:
    """quant.cuh warp_stage: the staged bytes land at buf + (src & 15); 16 bytes of slack after."""
    n = raw.size
    smem = np.full(((src_mod16 + n + 15) // 16 * 16 + 16,), 0xA5, np.uint8)   # stale bytes, not zeros
    smem[src_mod16: src_mod16 + n] = raw.reshape(-1)
    # the zero-filled tail of the last 16-byte chunk
    smem[src_mod16 + n: (src_mod16 + n + 15) // 16 * 16] = 0
    return smem, src_mod16


# ---- emulation of gemv's lanes ------------------------------------------------------------------------
def emulate_rows(fmt, data: np.ndarray, cols: int, lpr: int, base_mod16: int, x: np.ndarray | None = None,
                 n_cls: int = 3):
    """The lanes of gemv.cu row_dot, G = 32 / lpr rows per staged step. Returns the weights rebuilt from
    the lanes' exact decode (decode_run: what dequant/embed store) and, if x is given, each row's dot
    product as the kernel forms it: subnormal-encoded codes times x * 2^80 summed per byte class
    (n_cls = 3, the n_x = 1 kernels) or rescaled to one class (n_cls = 1), then
    a * sum(code x) + (b - a * OFFSET) * sum(x over the part). Every x address is checked against
    the layout."""
    rows = data.shape[0]
    rb = row_bytes(fmt, cols)
    G = 32 // lpr
    P = pieces_per_row(fmt, cols)
    out = np.full((rows, cols), np.nan, np.float32)
    dots = None
    a16 = fmt.IS_FLOAT and base_mod16 == 0 and rb % 16 == 0
    if x is not None:
        up = np.float32(2.0 ** X_SCALE_LOG2)
        xs = np.zeros(x_row_floats(fmt.XL, cols), np.float32)
        for c in range(cols):
            xs[x_phys(fmt.XL, c)] = np.float32(x[c] * up)
        pad = (cols + 31) // 32 * 32
        xp_ = np.zeros(pad, np.float32)
        xp_[:cols] = x
        xsum = {16: xp_.reshape(-1, 16).sum(1, dtype=np.float32), 32: xp_.reshape(-1, 32).sum(1, dtype=np.float32)}
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
                wp = wrow + blk * fmt.BB
                xp = fmt.xblk(blk) + fmt.xlane(j)
                x_step = fmt.xblk(blk_step)
                acc = np.float32(0)
                for p in range(t, P, lpr):
                    raw = fmt.load(smem, wp, j, a16)
                    pa, pb = fmt.params(raw, j)
                    if fmt.IS_FLOAT:
                        fmt.mask(raw, cols - blk * fmt.BE)
                    rpp = fmt.RUNS // fmt.PARTS
                    for part in range(fmt.PARTS):
                        cls = [np.float32(0)] * 3
                        dot = np.float32(0)
                        for rr in range(rpp):
                            run = part * rpp + rr
                            w = decode_run(fmt, raw, j, run, pa, pb)
                            c0 = blk * fmt.BE + fmt.col(j, run)
                            xo = xp + fmt.xrun(run)
                            for i in range(4):
                                assert xo + i == x_phys(fmt.XL, c0 + i), (fmt.__name__, lpr, t, p, run, i)
                                if c0 + i < cols:
                                    assert np.isnan(out[r0 + g, c0 + i]), "two lanes wrote one weight"
                                    out[r0 + g, c0 + i] = w[i]
                                else:
                                    assert fmt.IS_FLOAT and w[i] == 0, "tail weights are masked to 0"
                            if x is None:
                                continue
                            if fmt.IS_FLOAT:
                                for i in range(4):
                                    dot = np.float32(dot + np.float32(w[i] * xs[xo + i]))
                                continue
                            shift = fmt.part_shift(part)
                            v = scaled_codes(fmt.code_word(raw, j, run), shift, fmt.CODE_MASK)
                            if n_cls == 1:   # mul_keep_subnormal by 2^-8, 2^-16 (exact)
                                v = [v[0], np.float32(v[1] * exp2i(-8)), np.float32(v[2] * exp2i(-16)),
                                     np.float32(v[3] * exp2i(-16))]
                            k = [0, 1, 2, 2] if n_cls == 3 else [0, 0, 0, 0]
                            for i in range(4):
                                cls[k[i]] = np.float32(cls[k[i]] + np.float32(v[i] * xs[xo + i]))
                        if x is None:
                            continue
                        if fmt.IS_FLOAT:
                            acc = np.float32(acc + np.float32(exp2i(-X_SCALE_LOG2) * dot))
                            continue
                        shift = fmt.part_shift(part)
                        cx = np.float32(cls[0] * class_scale(0, shift))
                        if n_cls == 3:
                            cx = np.float32(cx + np.float32(cls[1] * class_scale(1, shift)))
                            cx = np.float32(cx + np.float32(cls[2] * class_scale(2, shift)))
                        bb = np.float32(pb[part] - np.float32(fmt.OFFSET) * pa[part])
                        grp = fmt.part_group(blk, j, part)
                        # the part's columns are group grp of PART_COLS columns
                        first = min(blk * fmt.BE + fmt.col(j, run) for run in range(part * rpp, (part + 1) * rpp))
                        assert first == grp * fmt.PART_COLS, (fmt.__name__, part, first, grp)
                        acc = np.float32(acc + np.float32(bb * xsum[fmt.PART_COLS][grp]))
                        acc = np.float32(acc + np.float32(pa[part] * cx))
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
    """gemv's per-part sums (subnormal-encoded codes times x * 2^80 per byte class, rescaled, plus
    (b - a * OFFSET) * sum x), vs float64 W @ x. Tolerance: float32 accumulation over <= 3 blocks with a
    zero-point cancellation of at most ~(|q| + OFFSET) / |q - OFFSET|: 1e-5 of sum |W||x|."""
    rng = np.random.default_rng()
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
    lane map admits 2-way conflicts (documented in quant.cuh)."""
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
    rng = np.random.default_rng()
    smem = rng.integers(0, 256, 64, dtype=np.uint8)
    for addr in range(0, 40, 2):
        got = lds_words(smem, addr, 3, 2)
        want = [int.from_bytes(smem[addr + 4 * k: addr + 4 * k + 4].tobytes(), "little") for k in range(3)]
        assert got == want
