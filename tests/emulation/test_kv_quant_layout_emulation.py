"""The quantized KV planes' index math on the CPU (native/cuda/kv_quant.cuh's dequant8_codes, as the attention
loaders apply it; test_kv_quant_stage_emulation.py emulates the cp.async staging in front of it): a row's
codes and scales as the write kernel lays them out, and the loaders' 16-byte pieces (8 values each) read back
from them, give exactly kv_quant.decode_rows of ggml's blocks -- the same bytes, regrouped. Also the plane
sizes fd_kv_plane_bytes returns."""
import numpy as np
import pytest

from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_types import row_bytes


def planes_of(blocks: np.ndarray, kind: str):
    """ggml blocks (rows, n_blocks * per) -> (codes (rows, code_bytes), scales (rows, n_blocks) float16), the
    device layout: codes of a row are its blocks' code bytes in order, scales its blocks' d in order."""
    per = 34 if kind == "q8_0" else 18
    b = blocks.reshape(blocks.shape[0], -1, per)
    return b[..., 2:].reshape(blocks.shape[0], -1), b[..., :2].copy().view(np.float16).reshape(blocks.shape[0], -1)


def load_piece(codes_row: np.ndarray, scales_row: np.ndarray, kind: str, piece: int) -> np.ndarray:
    """dequant8_codes' arithmetic for one piece: 8 values at dims [8 piece, 8 piece + 8), float32 d * q."""
    b, off = piece >> 2, (piece & 3) * 8
    d = np.float32(scales_row[b])
    if kind == "q8_0":
        q = codes_row[piece * 8:piece * 8 + 8].view(np.int8).astype(np.float32)
    else:
        raw = codes_row[b * 16 + (off & 15):b * 16 + (off & 15) + 8]
        q = (((raw >> (4 if off >= 16 else 0)) & 15).astype(np.int32) - 8).astype(np.float32)
    return d * q


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
def test_loader_pieces_are_the_decoded_rows(kind, head_dim):
    rng = np.random.default_rng(head_dim)
    x = (rng.standard_normal((9, head_dim)) * 3).astype(np.float32)
    blocks = encode_rows(x, kind)
    codes, scales = planes_of(blocks, kind)
    assert codes.shape[1] == (head_dim if kind == "q8_0" else head_dim // 2)
    want = decode_rows(blocks, kind)
    for r in range(x.shape[0]):
        got = np.concatenate([load_piece(codes[r], scales[r], kind, p) for p in range(head_dim // 8)])
        np.testing.assert_array_equal(got, want[r])
    # the 8-byte code loads are 8-byte aligned: a row's codes start at a multiple of 16 bytes (head_dim % 32 == 0)
    assert codes.shape[1] % 16 == 0


@pytest.mark.parametrize("kind,per", [("q8_0", 34), ("q4_0", 18)])
def test_plane_bytes(kind, per):
    # fd_kv_plane_bytes: n_kv_heads * max_ctx rows of codes then as many rows of scales = ggml's bytes per row
    n_kv_heads, max_ctx, head_dim = 3, 17, 128
    codes = head_dim if kind == "q8_0" else head_dim // 2
    assert n_kv_heads * max_ctx * (codes + 2 * head_dim // 32) == n_kv_heads * max_ctx * row_bytes(kind, head_dim)
    assert row_bytes(kind, head_dim) == head_dim // 32 * per
