"""backends/cuda/kv_planes.py: ggml blocks <-> the device planes, both ways, and the sizes fd_kv_plane_bytes gives."""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.kv_planes import blocks_from_planes, planes_from_blocks
from flashd.daemon.backends.kv_quant import encode_rows
from flashd.daemon.backends.kv_types import row_bytes


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
@pytest.mark.parametrize("n_kv_heads,max_ctx,head_dim", [(1, 1, 32), (2, 7, 64), (3, 5, 128), (2, 3, 256)])
def test_round_trip_and_layout(kind, n_kv_heads, max_ctx, head_dim):
    x = np.random.default_rng(head_dim).standard_normal((n_kv_heads, max_ctx, head_dim)).astype(np.float32)
    blocks = encode_rows(x, kind)
    raw = planes_from_blocks(blocks, kind)
    assert raw.size == n_kv_heads * max_ctx * row_bytes(kind, head_dim)
    np.testing.assert_array_equal(blocks_from_planes(raw, kind, n_kv_heads, max_ctx, head_dim), blocks)
    code_bytes = head_dim if kind == "q8_0" else head_dim // 2
    per = 32 if kind == "q8_0" else 16
    codes = raw[:n_kv_heads * max_ctx * code_bytes].reshape(n_kv_heads, max_ctx, code_bytes)
    first = blocks[..., 2:2 + per]                       # row r's first block's codes lead its codes row
    np.testing.assert_array_equal(codes[..., :per], first)
    scales = raw[n_kv_heads * max_ctx * code_bytes:].view(np.float16).reshape(n_kv_heads, max_ctx, head_dim // 32)
    np.testing.assert_array_equal(scales[..., :1].copy().view(np.uint8), blocks[..., :2])
    with pytest.raises(ValueError, match="plane"):
        blocks_from_planes(raw[:-1], kind, n_kv_heads, max_ctx, head_dim)
