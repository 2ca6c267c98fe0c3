"""Which kernels CudaOps' projections take (ops.py _on_gemv / gemv_group), on the host stand-in of the library,
which records the entry points instead of computing: up to 8 rows the GEMV kernels in one launch; a row-invariant
forward (tree verification) GEMV launches of 8 rows; other batches the float16 GEMM after dequantizing the weight --
except, when the tuning's gemv_rows is on, batches of up to 32 rows whose weights all run on gemv_rows.cuh (Q4_K,
Q6_K, Q8_0, Q5_0, each with its bit in gemv_rows_formats), which take one GEMV launch of all their rows (the DFlash
drafter's 16-row block). The kernels' results are the GPU's: tests/gpu/test_gemv_rows.py."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.cuda.ops import CudaOps, QuantWeight
from flashd.daemon.backends.cuda.tensor import Device
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative

Q5_0, Q8_0, F32 = 6, 8, 0
COLS, ROWS = 64, 48


class DispatchLib(HostMemoryLib):
    """Records fd_gemv / fd_gemv_multi / fd_gemv_swiglu (with their row counts) and fd_dequant_f16 / fd_gemm_*; the
    tuning's gemv_rows is `rows_tuning`, its gemv_rows_formats `formats`."""

    def __init__(self, ffi, rows_tuning: int, formats: int = 15):
        super().__init__(ffi)
        self.rows_tuning, self.formats, self.calls = rows_tuning, formats, []

    def fd_tuning_get(self, out):
        out.gemv_rows, out.gemv_rows_formats = self.rows_tuning, self.formats
        return 0

    def fd_gemv(self, y, w, qtype, rows, cols, x, n_x, norm_w, eps, bias, residual, stream):
        self.calls.append(("fd_gemv", n_x))
        return 0

    def fd_gemv_multi(self, n_mats, y, w, qtype, rows, bias, cols, x, n_x, norm_w, eps, stream):
        self.calls.append(("fd_gemv_multi", n_x))
        return 0

    def fd_gemv_swiglu(self, y, wg, qg, wu, qu, rows, cols, x, n_x, norm_w, eps, stream):
        self.calls.append(("fd_gemv_swiglu", n_x))
        return 0

    def fd_dequant_f16(self, dst, w, qtype, rows, cols, stream):
        self.calls.append(("fd_dequant_f16", rows))
        return 0

    def fd_gemm_f16(self, y, x, w16, m, n, k, bias, residual, stream):
        self.calls.append(("fd_gemm_f16", m))
        return 0

    def fd_gemm_swiglu_f16(self, y, x, g16, u16, m, n, k, stream):
        self.calls.append(("fd_gemm_swiglu_f16", m))
        return 0


def make_ops(rows_tuning: int, formats: int = 15) -> CudaOps:
    native = HostNative()
    native.lib = DispatchLib(native.ffi, rows_tuning, formats)
    ops = CudaOps(Device(native))
    ops.reserve_arena(1 << 20)
    ops.reserve_scratch(ROWS * COLS)
    return ops


def weight(ops, qtype: int) -> QuantWeight:
    n_bytes = ROWS * (COLS // 32 * {Q8_0: 34, Q5_0: 22}[qtype] if qtype in (Q8_0, Q5_0) else COLS * 4)
    return QuantWeight(ops.dev.empty((n_bytes,), np.uint8), qtype, ROWS, COLS)


def calls(ops, n: int, qtype: int, op: str = "linear", row_invariant: bool = False):
    ops.begin_forward(row_invariant=row_invariant)
    ops.dev.lib.calls.clear()
    x = ops.take((n, COLS))
    w = weight(ops, qtype)
    if op == "linear":
        ops.linear(x, w)
    elif op == "multi":
        ops.linear_multi(x, [w, weight(ops, qtype)], [None, None])
    else:
        ops.linear_swiglu(x, w, weight(ops, qtype))
    return ops.dev.lib.calls


@pytest.mark.parametrize("op,gemv,gemm", [("linear", "fd_gemv", ["fd_dequant_f16", "fd_gemm_f16"]),
                                          ("multi", "fd_gemv_multi", ["fd_dequant_f16", "fd_gemm_f16"] * 2),
                                          ("swiglu", "fd_gemv_swiglu", ["fd_dequant_f16"] * 2 + ["fd_gemm_swiglu_f16"])])
def test_batches_take_the_kernels_their_rows_and_tuning_allow(op, gemv, gemm):
    off, on = make_ops(0), make_ops(1)
    for ops in (off, on):
        assert calls(ops, 8, Q8_0, op) == [(gemv, 8)]                               # decode-sized: GEMV
        assert calls(ops, 16, Q8_0, op, row_invariant=True) == (                   # verification: GEMV groups
            [(gemv, 16)] if ops is on else [(gemv, 8), (gemv, 8)])
    assert [c[0] for c in calls(off, 16, Q8_0, op)] == gemm                        # 16 rows, gemv_rows off: GEMM
    assert calls(on, 16, Q8_0, op) == [(gemv, 16)]                                 # on: one gemv_rows launch
    assert calls(on, 32, Q8_0, op) == [(gemv, 32)]
    assert [c[0] for c in calls(on, 33, Q8_0, op)] == gemm                         # beyond 32 rows: GEMM
    assert [c[0] for c in calls(on, 16, F32, op)] == gemm                          # a format gemv_rows lacks: GEMM


@pytest.mark.parametrize("op,gemv", [("linear", "fd_gemv"), ("multi", "fd_gemv_multi"), ("swiglu", "fd_gemv_swiglu")])
def test_a_format_outside_gemv_rows_formats_keeps_the_one_row_kernels(op, gemv):
    """gemv_rows_formats 7 (Q4_K, Q6_K, Q8_0: the sm_90 entry) leaves Q5_0 on gemv.cuh: groups of 8 rows in a
    verification, the GEMM for a batch; Q8_0 keeps its one 16-row launch."""
    ops = make_ops(1, formats=7)
    assert calls(ops, 16, Q8_0, op, row_invariant=True) == [(gemv, 16)]
    assert calls(ops, 16, Q5_0, op, row_invariant=True) == [(gemv, 8), (gemv, 8)]
    assert calls(ops, 4, Q5_0, op) == [(gemv, 4)]
    assert calls(make_ops(1, formats=15), 16, Q5_0, op, row_invariant=True) == [(gemv, 16)]
