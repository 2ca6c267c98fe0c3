"""kv_quant.cuh's dequant8_codes on CUDA, emulated: the float16x2 path (no conversion instructions) against
kv_quant.decode_rows rounded to float16 -- the values the attention tiles must hold -- over every finite
float16 scale and every code, for both quantized types and every 8-value piece of a block.

The emulation follows the CUDA code step by step: the 8 code bytes of a piece as two little-endian words,
q8_0's sign flip (x ^ 0x80808080: byte q + 128) or q4_0's nibble select ((x >> shift) & 0x0f0f0f0f),
__byte_perm(word, 0x64646464, sel) with sel 0x4140 / 0x4342 (two float16 1024 + u in a word), then the two
float16 operations __hsub2_rn (minus 1152 or 1032: exact, the code's value) and __hmul2_rn (times d, one
correct rounding). numpy's float16 operations round the float32 result, which is the exact result here (a
difference of small integers; a product of 11 by 8 significant bits), so they are the correctly rounded
float16 operations the GPU performs. What the CPU cannot show is the GPU's own rounding of __hmul2_rn (the
PTX ISA's mul.rn.f16x2: round to nearest even, subnormals kept); tests/gpu/test_attention_kv_quant.py compares
the kernels bit for bit with the float16 kernels over these values, with subnormal products."""
import numpy as np
import pytest

from flashd.daemon.backends.kv_quant import decode_rows

BIAS = {"q8_0": np.uint16(0x6480).view(np.float16), "q4_0": np.uint16(0x6408).view(np.float16)}


def byte_perm(x: np.ndarray, y: int, sel: int) -> np.ndarray:
    """CUDA's __byte_perm(x, y, sel) for uint32 arrays x: byte i of the result is byte sel[4i:4i+4] & 7 of
    the 8 bytes x (0-3) then y (4-7)."""
    src = np.concatenate([x.astype(np.uint32)[..., None].view(np.uint8).reshape(*x.shape, 4),
                          np.broadcast_to(np.array([y], np.uint32).view(np.uint8), (*x.shape, 4))], axis=-1)
    out = np.stack([src[..., (sel >> (4 * i)) & 7] for i in range(4)], axis=-1)
    return np.ascontiguousarray(out).view(np.uint32)[..., 0]


def dequant8_half2(codes8: np.ndarray, d: np.ndarray, kind: str, piece: int) -> np.ndarray:
    """dequant8_codes' CUDA path for piece `piece` (0..3 within one block here): codes8 (n, 8) uint8 -- the
    8 bytes it loads -- and d (n,) float16 -> (n, 8) float16."""
    words = np.ascontiguousarray(codes8).view(np.uint32)              # (n, 2): c.x, c.y
    if kind == "q8_0":
        words = words ^ np.uint32(0x80808080)
    else:
        shift = 4 if piece * 8 >= 16 else 0
        words = (words >> np.uint32(shift)) & np.uint32(0x0F0F0F0F)
    d2 = d.astype(np.float16)[:, None]
    out = []
    with np.errstate(over="ignore"):                                   # large scales: inf, as on the GPU
        for w in (words[:, 0], words[:, 1]):
            for sel in (0x4140, 0x4342):
                h = byte_perm(w, 0x64646464, sel).view(np.uint16).reshape(-1, 2).view(np.float16)   # (lo, hi)
                q = (h - BIAS[kind]).astype(np.float16)
                out.append((q * d2).astype(np.float16))
    return np.concatenate(out, axis=1)


def all_scales() -> np.ndarray:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    d = bits.view(np.float16)
    return d[np.isfinite(d)]


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_half2_dequant_is_float16_of_d_times_q_for_every_scale_and_code(kind):
    d = all_scales()                                                   # 63,488 finite scales, both signs
    rng = np.random.default_rng(7)
    per = 34 if kind == "q8_0" else 18
    for piece in range(4):
        # every code value in every one of the piece's 8 positions: 256 (q8_0) or 16 x 16 (q4_0) code rows
        if kind == "q8_0":
            block_codes = (np.arange(256)[:, None] + np.arange(32)[None, :] * 37) % 256
            block_codes = block_codes.astype(np.uint8)                 # row r: codes r, r + 37, ... (all bytes)
        else:
            lo = (np.arange(256)[:, None] + np.arange(16)[None, :] * 5) % 16
            hi = (np.arange(256)[:, None] // 16 + np.arange(16)[None, :] * 3) % 16
            block_codes = (lo | (hi << 4)).astype(np.uint8)            # every (low, high) nibble pair
        rows = rng.integers(0, block_codes.shape[0], size=d.size)
        blocks = np.empty((d.size, per), np.uint8)
        blocks[:, :2] = d.view(np.uint8).reshape(-1, 2)
        blocks[:, 2:] = block_codes[rows]
        want = decode_rows(blocks, kind).astype(np.float16)[:, piece * 8:piece * 8 + 8]
        codes = blocks[:, 2:]
        loaded = codes[:, piece * 8:piece * 8 + 8] if kind == "q8_0" else codes[:, (piece * 8) % 16:(piece * 8) % 16 + 8]
        got = dequant8_half2(loaded, d, kind, piece)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_every_code_at_every_position_with_subnormal_results(kind):
    """Each code at each of a piece's 8 positions, scales at and around the float16 subnormal range."""
    d = np.concatenate([np.arange(1, 0x0C00, dtype=np.uint16), np.arange(0x8001, 0x8C00, dtype=np.uint16)]).view(np.float16)
    n_codes = 256 if kind == "q8_0" else 16
    for piece in range(4):
        for pos in range(8):
            for code in range(n_codes):
                loaded = np.zeros((d.size, 8), np.uint8)
                if kind == "q8_0":
                    loaded[:, pos] = code
                    q = np.uint8(code).view(np.int8).astype(np.float32)
                else:
                    loaded[:, pos] = code << 4 if piece >= 2 else code
                    q = np.float32(code - 8)
                got = dequant8_half2(loaded, d, kind, piece)[:, pos]
                want = (d.astype(np.float32) * q).astype(np.float16)
                np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
