"""Random valid GGUF weight tensors, fast (no quantizer): random codes with sane float16 scales. The GPU
kernel tests (test_dequant, test_gemv) and bench/bench_gemv.py feed them to the kernels; their oracle is
gguf.quants.dequantize of the same bytes."""
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

FORMATS = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
FLOAT_FORMATS = (T.F32, T.F16, T.BF16)


def random_weights(rng, qtype, rows: int, cols: int) -> np.ndarray:
    """(rows, row_bytes) uint8 of a valid tensor: random codes, sane f16 scales (d, dmin, m)."""
    if qtype in FLOAT_FORMATS:
        v = rng.standard_normal((rows, cols)).astype(np.float32)
        if qtype == T.F32:
            return v.view(np.uint8).reshape(rows, -1)
        if qtype == T.F16:
            return v.astype(np.float16).view(np.uint8).reshape(rows, -1)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    block, size = GGML_QUANT_SIZES[qtype]
    nb = cols // block
    data = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)

    def f16(lo, hi):
        mag = np.exp(rng.uniform(np.log(lo), np.log(hi), (rows, nb)))
        sign = np.where(rng.random((rows, nb)) < 0.5, -1.0, 1.0)
        return (mag * sign).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)

    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        data[..., 0:2] = f16(1e-4, 1e-1)
    elif qtype == T.Q4_1:
        data[..., 0:2] = f16(1e-4, 1e-1)
        data[..., 2:4] = f16(1e-4, 1.0)
    elif qtype in (T.Q4_K, T.Q5_K):
        data[..., 0:2] = f16(1e-5, 1e-2)
        data[..., 2:4] = f16(1e-5, 1e-2)
    elif qtype == T.Q6_K:
        data[..., 208:210] = f16(1e-5, 1e-2)
    return data.reshape(rows, nb * size)


# byte ranges of each block's float16 scale fields (every value of a block is linear in them: d, and dmin / m)
SCALE_FIELDS = {T.Q4_0: ((0, 2),), T.Q5_0: ((0, 2),), T.Q8_0: ((0, 2),), T.Q4_1: ((0, 2), (2, 4)),
                T.Q4_K: ((0, 2), (2, 4)), T.Q5_K: ((0, 2), (2, 4)), T.Q6_K: ((208, 210),)}


def scaled_weights(data: np.ndarray, qtype, cols: int, rms: float) -> np.ndarray:
    """`data` ((rows, row_bytes) uint8 of random_weights) with every block's scale fields multiplied by one factor,
    so that the dequantized values' root mean square is `rms` (random_weights' scales suit one kernel call; a
    model's dozens of layers of them overflow float16 activations: a clone's logits came out NaN)."""
    from gguf.quants import dequantize

    rows = data.shape[0]
    have = float(np.sqrt(np.mean(np.square(dequantize(data, qtype).astype(np.float64)))))
    if not have > 0:
        return data
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = data.reshape(rows, cols // block, size).copy()
    for lo, hi in SCALE_FIELDS[qtype]:
        field = np.ascontiguousarray(blocks[..., lo:hi]).view(np.float16)
        blocks[..., lo:hi] = (field.astype(np.float32) * np.float32(rms / have)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def cols_of(qtype, n_blocks: int) -> int:
    return n_blocks if qtype in FLOAT_FORMATS else n_blocks * GGML_QUANT_SIZES[qtype][0]
