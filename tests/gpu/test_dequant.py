"""fd_dequant_f16 and fd_embed against gguf.quants.dequantize, every format, awkward shapes.

Tolerance: none. Every decoded weight is a*q + b with a*q exact in float32, so the kernels produce
gguf's float32 values bit for bit; fd_dequant_f16 then rounds to nearest even exactly like numpy's
astype(float16). Outputs are poisoned with NaN bytes first, so an unwritten element fails.
"""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from flashd.scripts.random_weights import FLOAT_FORMATS, FORMATS, cols_of, random_weights

FD_E_ARG, FD_E_QTYPE, FD_E_SHAPE = -1, -2, -3


def dequant_f32(data, qtype, rows, cols):
    return dequantize(data, qtype).reshape(rows, cols).astype(np.float32)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("rows,n_blocks", [(1, 1), (7, 3), (129, 7), (1000, 6)])
def test_dequant_f16_is_exact(native, dev, rng, poisoned, qtype, rows, n_blocks):
    # float formats have 1-element "blocks": any cols, including ones that end mid 16-byte chunk
    cols = cols_of(qtype, n_blocks) if qtype not in FLOAT_FORMATS else {1: 1, 3: 3, 7: 7, 6: 37}[n_blocks]
    data = random_weights(rng, qtype, rows, cols)
    w = dev.upload(data)
    out = poisoned((rows, cols), np.float16)
    native.check(native.lib.fd_dequant_f16(dev.p(out), dev.p(w), int(qtype), rows, cols, dev.stream), "fd_dequant_f16")
    dev.synchronize()
    got = dev.download(out)
    want = dequant_f32(data, qtype, rows, cols).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.slow
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0, T.F16], ids=lambda q: q.name)
def test_dequant_f16_large_tensor(native, dev, rng, poisoned, qtype):
    rows, cols = 4099, 1536   # many steps per warp, all CTAs busy
    data = random_weights(rng, qtype, rows, cols)
    w = dev.upload(data)
    out = poisoned((rows, cols), np.float16)
    native.check(native.lib.fd_dequant_f16(dev.p(out), dev.p(w), int(qtype), rows, cols, dev.stream), "fd_dequant_f16")
    dev.synchronize()
    want = dequant_f32(data, qtype, rows, cols).astype(np.float16)
    np.testing.assert_array_equal(dev.download(out).view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("n_blocks", [1, 3, 35])
def test_embed_rows_and_out_of_range_ids(native, dev, rng, poisoned, qtype, n_blocks):
    n_table = 50
    cols = cols_of(qtype, n_blocks) if qtype not in FLOAT_FORMATS else {1: 3, 3: 21, 35: 1537}[n_blocks]
    data = random_weights(rng, qtype, n_table, cols)
    table = dev.upload(data)
    # repeats, first/last rows, and ids just outside the table on both sides
    ids = np.array([3, 0, n_table - 1, 3, -1, 17, n_table, 3, 2**31 - 1], np.int32)
    d_ids = dev.upload(ids)
    out = poisoned((len(ids), cols), np.float32)
    native.check(native.lib.fd_embed(dev.p(out, "float*"), dev.p(table), int(qtype), n_table, cols,
                                     dev.p(d_ids, "int32_t*"), len(ids), dev.stream), "fd_embed")
    dev.synchronize()
    got = dev.download(out)
    full = dequant_f32(data, qtype, n_table, cols)
    for i, idx in enumerate(ids):
        if 0 <= idx < n_table:
            np.testing.assert_array_equal(got[i].view(np.uint32), full[idx].view(np.uint32), err_msg=f"row {i}")
        else:
            assert np.isnan(got[i]).all(), f"out-of-range id {idx} must give a NaN row"
            # the poison is also NaN: check the quiet-NaN pattern the kernel writes
            assert (got[i].view(np.uint32) == 0x7FC00000).all()


def test_embed_no_ids_is_a_no_op(native, dev, rng):
    table = dev.upload(random_weights(rng, T.Q8_0, 4, 32))
    ids = dev.upload(np.zeros(1, np.int32))
    out = dev.empty((1, 32))
    native.check(native.lib.fd_embed(dev.p(out, "float*"), dev.p(table), int(T.Q8_0), 4, 32,
                                     dev.p(ids, "int32_t*"), 0, dev.stream), "fd_embed")


def test_bad_arguments(native, dev, rng):
    lib, ffi = native.lib, native.ffi
    w = dev.upload(random_weights(rng, T.Q4_K, 2, 512))
    out = dev.empty((2, 512), np.float16)
    s = dev.stream
    assert lib.fd_dequant_f16(dev.p(out), dev.p(w), int(T.Q4_K), 2, 500, s) == FD_E_SHAPE
    assert lib.fd_dequant_f16(dev.p(out), dev.p(w), int(T.Q2_K), 2, 512, s) == FD_E_QTYPE
    assert lib.fd_dequant_f16(dev.p(out), dev.p(w), 99, 2, 512, s) == FD_E_QTYPE
    assert lib.fd_dequant_f16(dev.p(out), ffi.cast("void*", w.ptr + 2), int(T.Q4_K), 1, 256, s) == FD_E_ARG
    assert lib.fd_dequant_f16(dev.p(out), dev.p(w), int(T.Q4_K), 0, 256, s) == FD_E_ARG
    assert lib.fd_dequant_f16(ffi.NULL, dev.p(w), int(T.Q4_K), 1, 256, s) == FD_E_ARG
    ids = dev.upload(np.zeros(2, np.int32))
    out32 = dev.empty((2, 512))
    assert lib.fd_embed(dev.p(out32, "float*"), dev.p(w), int(T.Q4_K), 2, 500, dev.p(ids, "int32_t*"), 2, s) == FD_E_SHAPE
    assert lib.fd_embed(dev.p(out32, "float*"), dev.p(w), int(T.IQ4_NL), 2, 512, dev.p(ids, "int32_t*"), 2, s) == FD_E_QTYPE
    assert lib.fd_embed(dev.p(out32, "float*"), dev.p(w), int(T.Q4_K), 2, 512, ffi.NULL, 2, s) == FD_E_ARG
