"""o's int8 codes on the host side (no GPU): when the attention is asked to write them (AttentionOps._o_codes: the
tuning's attn_o_codes, head_dim 128, a forward of 2 or more rows), the buffers' sizes, and the slices
CudaOps.linear hands fd_gemv_xq (XCodes.rows: flashd_attention.h's layout, scales in blocks of 32 rows). An off-by-one
in the scale offset would feed a GEMV another row's scales; the GPU tests (tests/gpu/test_o_codes.py) check the bits."""
import types

import numpy as np
import pytest

from flashd.daemon.backends.cuda.attention_ops import AttentionOps
from flashd.daemon.backends.cuda.tensor import DeviceTensor, XCodes


class FakeOps(AttentionOps):
    def __init__(self, on=True):
        self.o_codes_on = on
        self.ffi = types.SimpleNamespace(NULL=None)
        self.taken = []
        self.next = 1 << 20

    def take(self, shape, dtype=np.float32):
        t = DeviceTensor(self.next, tuple(shape), np.dtype(dtype))
        self.next += 1 << 20
        self.taken.append(t)
        return t

    def p(self, t):
        return None if t is None else ("ptr", t.ptr)


def shape_struct():
    return types.SimpleNamespace(o_codes=None, o_scales=None)


@pytest.mark.parametrize("n,rows,blocks", [(2, 8, 1), (8, 8, 1), (9, 16, 1), (32, 32, 1), (33, 40, 2), (65, 72, 3)])
def test_buffers_cover_the_rows_the_kernels_read(n, rows, blocks):
    ops, shape = FakeOps(), shape_struct()
    codes = ops._o_codes(n, 12, 128, shape)
    assert codes.q.shape == (rows, 12 * 128) and codes.q.dtype == np.int8     # 8-row tiles are read whole
    assert codes.sc.shape == (blocks * 12, 32) and codes.groups == 12
    assert shape.o_codes == ("ptr", codes.q.ptr) and shape.o_scales == ("ptr", codes.sc.ptr)
    ops._no_codes(shape)
    assert shape.o_codes is None and shape.o_scales is None


@pytest.mark.parametrize("on,head_dim,n", [
    (False, 128, 4),                            # the tuning's attn_o_codes off
    (True, 64, 4),                              # a 128-column group would span two heads
    (True, 256, 4),                             # a head spans two groups
    (True, 128, 1),                             # a decode step: its projection quantizes o without a launch
])
def test_no_codes_where_they_cannot_be_written_or_would_not_pay(on, head_dim, n):
    ops, shape = FakeOps(on), shape_struct()
    assert ops._o_codes(n, 8, head_dim, shape) is None
    assert ops.taken == [] and shape.o_codes is None


def test_row_slices_address_their_codes_and_scales():
    q = DeviceTensor(1000, (72, 1536), np.dtype(np.int8))
    sc = DeviceTensor(500000, (36, 32), np.dtype(np.float32))
    codes = XCodes(q, sc, 12)
    for s, e in [(0, 8), (8, 16), (24, 32), (0, 32), (32, 64), (40, 48), (64, 65)]:
        xq, xsc = codes.rows(s, e)
        assert xq.ptr == 1000 + s * 1536 and xq.shape == (e - s, 1536)
        # row i of the slice, group g: ((s + i) // 32 * 12 + g) * 32 + (s + i) % 32 floats from sc, i.e. the slice's
        # base plus g * 32 + i -- fd_gemv_xq's [group][32] layout
        assert xsc.ptr == 500000 + 4 * ((s // 32) * 12 * 32 + s % 32)
    with pytest.raises(ValueError, match="cross"):
        codes.rows(30, 34)


def test_the_arena_holds_the_codes_of_a_chunk_where_they_are_made():
    """backend._arena_half_bytes: head_dim 128 adds o's codes (rows rounded up to 8, int8) and scales (blocks of 32
    rows, float32) of a whole chunk, each 256-byte aligned; other head sizes nothing."""
    from flashd.daemon.backends.cuda.backend import _arena_half_bytes

    def cfg(head_dim, n_heads):
        return types.SimpleNamespace(hidden=1536, q_dim=n_heads * head_dim, kv_dim=256, ffn=8960, head_dim=head_dim,
                                     n_heads=n_heads, vocab_size=1000)
    for chunk in (100, 333, 512):                                # the layer, not the head, sets the size
        base = _arena_half_bytes(cfg(64, 24), chunk)            # the same q_dim, head_dim 64: no codes
        codes = -(-(-(-chunk // 8) * 8 * 1536) // 256) * 256 + -(-(-(-chunk // 32) * 32 * 12 * 4) // 256) * 256
        assert _arena_half_bytes(cfg(128, 12), chunk) == base + codes
