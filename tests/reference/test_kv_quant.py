"""The KV cache's q8_0 / q4_0 encoders (daemon/backends/kv_quant.py) against ggml's reference rounding.

Two oracles: gguf.quants (gguf-py's Q8_0 / Q4_0, written to be bit-exact with ggml-quants.c's
quantize_row_*_ref) and a scalar transcription of those C loops below, one float32 operation at a time.
Tolerance: none -- codes and float16 scales must be bit-equal, and decoding must give gguf.quants.dequantize's
float32 values exactly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_types import KVTypes, parse_kv_types, row_bytes, window_slots

QTYPE = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}
f32 = np.float32


def awkward_rows(seed: int, n_rows: int = 64, head_dim: int = 128) -> np.ndarray:
    """float32 (n_rows, head_dim), head_dim % 32 == 0: scales from 1e-6 to 1e4, then (placed block by block from
    the first, as many as fit) an all-zero block (d = 0, id = 0), exact .5 ties of x/d for q8_0, a +-127 sign tie
    of the largest magnitude (q4_0: the first, -127, wins), a negative maximum (q4_0: d > 0), one outlier among
    small values, values near half-way after 1/d and one ulp above them."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_rows, head_dim)) * 10.0 ** rng.uniform(-6, 4, (n_rows, 1))).astype(f32)
    ramp = np.arange(32, dtype=f32)
    near = (ramp + f32(0.5)) * f32(127.0 / 31.5)
    outlier = np.full(32, 1e-3, f32)
    outlier[6] = 1e3
    special = [np.zeros(32, f32), ramp - f32(15.5), np.where(np.arange(32) % 2, 127, -127).astype(f32),
               -np.linspace(0, 8, 32, dtype=f32), outlier, near, np.nextafter(near, f32(np.inf))]
    blocks = x.reshape(-1, 32)                                 # a view: block i is row i // (head_dim / 32)
    for i, block in enumerate(special[:len(blocks)]):
        blocks[i] = block
    return x


def ggml_q8_0_block(x: np.ndarray) -> bytes:
    """quantize_row_q8_0_ref for one block, scalar: d = amax / 127; id = d ? 1/d : 0; q = roundf(x * id)."""
    amax = f32(0)
    for v in x:
        amax = max(amax, f32(abs(v)))
    d = f32(amax / f32(127))
    inv = f32(f32(1) / d) if d else f32(0)
    out = bytearray(np.float16(d).tobytes())
    for v in x:
        x0 = f32(v * inv)
        out += int(math.copysign(math.floor(abs(float(x0)) + 0.5), float(x0))).to_bytes(1, "little", signed=True)
    return bytes(out)


def ggml_q4_0_block(x: np.ndarray) -> bytes:
    """quantize_row_q4_0_ref for one block, scalar: max = the first value of largest magnitude, d = max / -8,
    q = MIN(15, (int8_t)(x * id + 8.5f)); byte j = q[j] | q[j + 16] << 4."""
    amax, mx = f32(0), f32(0)
    for v in x:
        if amax < f32(abs(v)):
            amax, mx = f32(abs(v)), f32(v)
    d = f32(mx / f32(-8))
    inv = f32(f32(1) / d) if d else f32(0)
    q = [min(15, int(f32(f32(v * inv) + f32(8.5)))) for v in x]
    return np.float16(d).tobytes() + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_encoder_is_gguf_quants_bit_for_bit(kv_type, seed):
    x = awkward_rows(seed)
    ours = encode_rows(x, kv_type)
    assert ours.shape == (64, row_bytes(kv_type, 128)) and ours.dtype == np.uint8
    theirs = quantize(x, QTYPE[kv_type])
    np.testing.assert_array_equal(ours, theirs.reshape(ours.shape))


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_encoder_is_the_scalar_c_loop(kv_type):
    scalar = ggml_q8_0_block if kv_type == "q8_0" else ggml_q4_0_block
    x = awkward_rows(7, n_rows=12)
    ours = encode_rows(x, kv_type).reshape(-1, 34 if kv_type == "q8_0" else 18)
    for i, block in enumerate(x.reshape(-1, 32)):
        assert ours[i].tobytes() == scalar(block), f"block {i}: {block}"


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_decoder_is_gguf_dequantize_exactly(kv_type):
    x = awkward_rows(3)
    rows = encode_rows(x, kv_type)
    np.testing.assert_array_equal(decode_rows(rows, kv_type), dequantize(rows, QTYPE[kv_type]).reshape(x.shape))


@pytest.mark.parametrize("kv_type,steps,step_error", [("q8_0", 127, 0.5), ("q4_0", 8, 1.0)])
def test_round_trip_error_is_bounded_by_the_step(kv_type, steps, step_error):
    # A bound on the format, not on the oracle. Per block d = amax / steps: q8_0 rounds to nearest (|err| <= d / 2);
    # q4_0 truncates x / d + 8.5 and clamps the code at 15, so a value of the opposite sign to the largest one
    # can lose a whole step (|err| <= d). Plus the float16 rounding of d (2^-11 relative) times the largest
    # code. Scales kept where d is a normal float16 (tiny blocks underflow d, a documented limit of the format).
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 128)) * 10.0 ** rng.uniform(-1, 3, (64, 1))).astype(f32)
    back = decode_rows(encode_rows(x, kv_type), kv_type)
    blocks, err = x.reshape(-1, 32), np.abs(back - x).reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    bound = amax / steps * (step_error + 1e-6) + amax * 2.0 ** -10
    assert (err.max(axis=1) <= bound).all()


def test_encode_keeps_leading_axes_and_refuses_partial_blocks():
    x = np.ones((3, 5, 2, 64), f32)
    assert encode_rows(x, "q4_0").shape == (3, 5, 2, 36)
    assert decode_rows(encode_rows(x, "q4_0"), "q4_0").shape == x.shape
    with pytest.raises(ValueError, match="32"):
        encode_rows(np.ones((2, 48), f32), "q8_0")


def test_kv_types_parse_and_check():
    assert parse_kv_types(None, None, None) == KVTypes("f16", "f16")
    # a q4_0 side gets the default window (DEFAULT_Q4_WINDOW) unless --kv-window says otherwise
    assert parse_kv_types("q8_0", None, "q4_0") == KVTypes("q8_0", "q4_0", 512)
    assert parse_kv_types(None, "q4_0", None, 0) == KVTypes("q4_0", "f16")
    assert parse_kv_types("q8_0", None, None) == KVTypes("q8_0", "q8_0")
    assert parse_kv_types("q8_0", None, None, 128) == KVTypes("q8_0", "q8_0", 128)
    with pytest.raises(ValueError, match="quantized"):
        parse_kv_types(None, None, None, 64)
    with pytest.raises(ValueError, match="multiple of 64"):
        parse_kv_types("q4_0", None, None, 100)
    assert window_slots(0, 512) == 0 and window_slots(512, 512) == 1024 and window_slots(512, 65) == 640
    assert str(KVTypes("q8_0", "q8_0")) == "q8_0" and str(KVTypes("q8_0", "f16")) == "k=q8_0,v=f16"
    with pytest.raises(ValueError, match="one of"):
        KVTypes("q5_1")
    with pytest.raises(ValueError, match="multiple of 32"):
        KVTypes("f16", "q4_0").check_head_dim(80)
    KVTypes().check_head_dim(80)                                  # f16 stores any head_dim
    assert row_bytes("q8_0", 128) == 136 and row_bytes("q4_0", 64) == 36 and row_bytes("f16", 80) == 160
