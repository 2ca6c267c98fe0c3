"""Emulation of gemv's lanes (native/cuda/gemv_dot.cuh row_dot over a step staged by quant_stage.cuh
warp_stage) on the decoders of quant_emulation.py, for tests/emulation/test_quant_layouts.py: random
valid GGUF tensors, a row's bytes and pieces, the lanes-per-row choices, the staged shared-memory image,
and emulate_rows -- the weights every lane rebuilds and each row's dot product as the kernel forms it."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from tests.emulation.quant_emulation import X_SCALE_LOG2, class_scale, decode_run, exp2i, scaled_codes, x_phys, x_row_floats

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
    """gemv_plan.cuh choose_lpr's candidates."""
    return [lpr for lpr in (4, 8, 16, 32) if lpr >= fmt.LPB and lpr >= fmt.MIN_LPR]


def stage(raw: np.ndarray, src_mod16: int) -> tuple[np.ndarray, int]:
    """quant_stage.cuh warp_stage: the staged bytes land at buf + (src & 15); 16 bytes of slack after."""
    n = raw.size
    smem = np.full(((src_mod16 + n + 15) // 16 * 16 + 16,), 0xA5, np.uint8)   # stale bytes, not zeros
    smem[src_mod16: src_mod16 + n] = raw.reshape(-1)
    # the zero-filled tail of the last 16-byte chunk
    smem[src_mod16 + n: (src_mod16 + n + 15) // 16 * 16] = 0
    return smem, src_mod16


# ---- emulation of gemv's lanes ------------------------------------------------------------------------
def emulate_rows(fmt, data: np.ndarray, cols: int, lpr: int, base_mod16: int, x: np.ndarray | None = None,
                 n_cls: int = 3):
    """The lanes of gemv_dot.cuh row_dot, G = 32 / lpr rows per staged step. Returns the weights rebuilt from
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

