"""o's int8 codes on the host side (no GPU): when the attention is asked to write them (AttentionOps._o_codes: the
tuning's attn_o_codes, head_dim 128, a max_keys bound no row can split under), the buffers' sizes, and the slices
CudaOps.linear hands fd_gemv_xq (XCodes.rows: flashd_attention.h's layout, scales in blocks of 32 rows). An off-by-one
in the scale offset would feed a GEMV another row's scales; the GPU tests (tests/gpu/test_o_codes.py) check the bits."""
import types

import numpy as np
import pytest

from flashd.daemon.backends.cuda.attention_ops import DECODE_CHUNK_SLOTS, AttentionOps
from flashd.daemon.backends.cuda.tensor import DeviceTensor, XCodes


class FakeOps(AttentionOps):
    def __init__(self, on=True, max_keys=256, single_chunks=4):
        self.o_codes_on = on
        self.attention_max_keys = max_keys
        self.attn_single_chunks = single_chunks
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


@pytest.mark.parametrize("n,rows,blocks", [(1, 8, 1), (8, 8, 1), (9, 16, 1), (32, 32, 1), (33, 40, 2), (65, 72, 3)])
def test_buffers_cover_the_rows_the_kernels_read(n, rows, blocks):
    ops, shape = FakeOps(), shape_struct()
    codes = ops._o_codes(n, 12, 128, shape)
    assert codes.q.shape == (rows, 12 * 128) and codes.q.dtype == np.int8     # 8-row tiles are read whole
    assert codes.sc.shape == (blocks * 12, 32) and codes.groups == 12
    assert shape.o_codes == ("ptr", codes.q.ptr) and shape.o_scales == ("ptr", codes.sc.ptr)
    ops._no_codes(shape)
    assert shape.o_codes is None and shape.o_scales is None


@pytest.mark.parametrize("on,head_dim,max_keys,single", [
    (False, 128, 256, 4),                       # the tuning's attn_o_codes off
    (True, 64, 256, 4),                         # a 128-column group would span two heads
    (True, 256, 256, 4),                        # a head spans two groups
    (True, 128, 0, 4),                          # no bound: a row may be split (the deep graphs)
    (True, 128, 4 * DECODE_CHUNK_SLOTS + 1, 4), # a bound past the unsplit rows
    (True, 128, 256, 2),                        # the tuning keeps only 128 keys unsplit
])
def test_no_codes_where_the_launch_cannot_write_them(on, head_dim, max_keys, single):
    ops, shape = FakeOps(on, max_keys, single), shape_struct()
    assert ops._o_codes(4, 8, head_dim, shape) is None
    assert ops.taken == [] and shape.o_codes is None


def test_the_bound_itself_is_unsplit():
    ops = FakeOps(True, 4 * DECODE_CHUNK_SLOTS, 4)
    assert ops._o_codes(1, 8, 128, shape_struct()) is not None


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
