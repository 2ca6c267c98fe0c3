"""Numpy transcriptions of the device-side GGUF decoders (native/cuda/quant.cuh and the quant_*.cuh it
includes), for tests/emulation/test_quant_layouts.py: the device helpers (x layouts, shared-memory word
loads with funnel shifts, codes to floats), one `Emu*` class per `Fmt<QT>` -- which bytes a lane loads
from the staged shared-memory image, which nibbles/bits it combines, which scale it applies, which
columns its runs cover and where it reads the activations -- and decode_run, the exact decode of a run."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

MAGIC = np.float32(8388608.0)   # 2^23
X_SCALE_LOG2 = 80                # gemv stages xn * 2^80 (quant_codes.cuh)
XL_PAD32, XL_PAD64 = 0, 1


# ---- the device helpers -----------------------------------------------------------------------------
def x_phys(layout: int, e: int) -> int:
    return e + 4 * (e >> 6) if layout == XL_PAD64 else e + 4 * (e >> 5)


def x_row_floats(layout: int, cols: int) -> int:
    c = (cols + 63) & ~63
    return c + c // 16 if layout == XL_PAD64 else c + c // 8


def lds_words(smem: np.ndarray, addr: int, n: int, align: int) -> list[int]:
    """quant_codes.cuh lds_words: n little-endian u32 words at byte address addr of shared memory."""
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
    """quant_codes.cuh exact_codes: PRMT each code byte into 0x4B0000cc, minus 2^23 + offset (float32)."""
    c = (w >> shift) & (mask * 0x01010101)
    return [np.float32(u32_f32(0x4B000000 | ((c >> (8 * i)) & 0xFF)) - np.float32(MAGIC + np.float32(offset)))
            for i in range(4)]


def scaled_codes(w: int, shift: int, mask: int) -> list[np.float32]:
    """quant_codes.cuh scaled_codes: one AND per code; the patterns (< 2^24) read as float32 are exactly
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


# ---- the formats (mirror Fmt<QT> in quant_float/q32/kquant.cuh) ---------------------------------------
# One class per Fmt<QT>, each complete, as the headers spell each struct out: methods that two formats share
# (Q4_0/Q4_1's code_word, Q4_K/Q5_K's column maps) are repeated on purpose, so that a class reads line by line
# against its struct and a change to one format's struct has exactly one class to change here.
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


# The 32-element formats: each class mirrors its Fmt<QT> in native/cuda/quant_q32.cuh, the same members in
# the same order, and Q4_1 repeats Q4_0's code_word / part_shift / part_group as quant_q32.cuh does -- on
# purpose, so each class reads side by side with its kernel block.
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
    """quant_kquant.cuh kquant_params: lane c's (scale, min) pairs for sub-blocks 2c, 2c+1, branch-free."""
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
