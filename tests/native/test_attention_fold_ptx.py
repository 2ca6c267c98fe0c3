"""The folded combine computes exactly combine_kernel's arithmetic, checked on the compiled code without a GPU.

fd_attention_decode / fd_attention_decode_rope fold the split-K combine into the split kernel
(native/cuda/attention_splitk_combine.cuh: fold_combine, run by the last split blocks of a query-row tile),
while fd_attention_masked keeps the combine_kernel launch (combine_row); tree verification reproduces decode
bit for bit only if both give the same bits. Here both are compiled by nvcc to PTX with the library's flags
and run on the CPU by tests/native/ptx_dataflow.py, whose float values are expression graphs: every output
element of fold_combine (all ranks of K combining blocks, or one block doing every pass) must be the very
expression combine_row builds for it -- the same fma / mul / ex2 / max / div operations in the same order over
the same partials -- for head_dim 64 / 128 / 256, active split counts from 1 to two rounds of splits a lane,
and several row counts. tests/gpu/test_attention_decode_fold.py checks the bits on the GPU.
"""
import shutil
import struct
import subprocess

import numpy as np
import pytest
from tests.native.ptx_dataflow import Block, Dag, Kernel

from flashd.native import CUDA_DIR

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: the PTX needs it")

HARNESS = r"""
#include "attention_splitk.cuh"
using namespace fd::attn;

__device__ __forceinline__ Params harness_params(float* o, float* acc, float* m, float* l, unsigned* cnt,
                                                 const int* n_past, int n_heads, int n_kv, int n_splits, int fold) {
    Params p = {};
    p.o = o; p.ws_acc = acc; p.ws_m = m; p.ws_l = l; p.counters = cnt; p.n_past = n_past; p.mask = nullptr;
    p.n = 1; p.n_heads = n_heads; p.n_kv_heads = n_kv; p.group = n_heads / n_kv;
    p.row_tiles = (p.group + ROWS - 1) / ROWS; p.max_ctx = 1 << 30; p.chunk_len = 64; p.n_splits = n_splits;
    p.fold = fold;
    return p;
}
template <int HD>
__global__ void combine_harness(float* o, float* acc, float* m, float* l, const int* n_past, int n_heads, int n_kv,
                                int n_splits) {
    combine_row<HD>(harness_params(o, acc, m, l, nullptr, n_past, n_heads, n_kv, n_splits, 0), blockIdx.x);
}
template <int HD>
__global__ void fold_harness(float* o, float* acc, float* m, float* l, unsigned* cnt, const int* n_past, int n_heads,
                             int n_kv, int n_splits, int fold, int kvh, int tile, int n_active) {
    extern __shared__ __align__(16) unsigned char smem[];
    const Params p = harness_params(o, acc, m, l, cnt, n_past, n_heads, n_kv, n_splits, fold);
    fold_combine<HD>(p, 0, kvh, tile, tile * ROWS, n_active, reinterpret_cast<float*>(smem));
}
#define INST(HD) \
    template __global__ void combine_harness<HD>(float*, float*, float*, float*, const int*, int, int, int); \
    template __global__ void fold_harness<HD>(float*, float*, float*, float*, unsigned*, const int*, int, int, int, \
                                              int, int, int, int);
INST(64)
INST(128)
INST(256)
"""

O, ACC, M, L, CNT, NPAST = 0x1000_0000, 0x2000_0000, 0x3000_0000, 0x3800_0000, 0x4000_0000, 0x5000_0000


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    d = tmp_path_factory.mktemp("fold_ptx")
    (d / "harness.cu").write_text(HARNESS)
    cmd = ["nvcc", "-std=c++17", "-arch=compute_90", "-O3", "--use_fast_math", "--expt-relaxed-constexpr",
           f"-I{CUDA_DIR}", "-ptx", str(d / "harness.cu"), "-o", str(d / "harness.ptx")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return (d / "harness.ptx").read_text()


def memory(dag, rng, n_rows, n_splits, head_dim, n_active, counter=None):
    """The partials of n_rows query rows (leaves of the graph, named by (what, row, split, dim)), n_past."""
    g = {NPAST: n_active * 64 - 1}
    m = (rng.standard_normal((n_rows, n_splits)) * 5).astype(np.float32)
    lsum = rng.uniform(0.5, 30.0, (n_rows, n_splits)).astype(np.float32)
    acc = rng.standard_normal((n_rows, n_splits, head_dim)).astype(np.float32)
    for r in range(n_rows):
        for s in range(n_splits):
            g[M + (r * n_splits + s) * 4] = (m[r, s], dag.node("leaf", "m", r, s))
            g[L + (r * n_splits + s) * 4] = (lsum[r, s], dag.node("leaf", "l", r, s))
            for e in range(head_dim):
                g[ACC + ((r * n_splits + s) * head_dim + e) * 4] = (acc[r, s, e], dag.node("leaf", "a", r, s, e))
    if counter is not None:
        g[CNT + counter[0] * 4] = counter[1]
    return g


def outputs(block):
    return {(a - O) // 4: ids for a, ids in block.stores.items() if a >= O and a < ACC}


def args(*vals):
    return [struct.pack("<Q" if isinstance(v, tuple) else "<i", v[0] if isinstance(v, tuple) else v) for v in vals]


@pytest.mark.parametrize("head_dim,n_heads,n_kv,n_splits,n_active,kvh,tile,folds", [
    (64, 6, 2, 40, 1, 1, 0, (1, 66)),         # one active split: it combines alone
    (64, 6, 2, 40, 5, 0, 0, (66,)),           # 8 combine warps in use (nw 8), K = 5 blocks
    (128, 2, 1, 264, 264, 0, 0, (3,)),        # two rounds a lane (13 x 16 < 264); K capped at 3
    (128, 20, 1, 66, 17, 0, 1, (66,)),        # the second row tile (rows 16..19)
    (256, 1, 1, 140, 140, 0, 0, (1, 132)),    # head_dim 256: two rounds (8 x 16 < 140)
])
def test_fold_combine_is_combine_row(ptx, head_dim, n_heads, n_kv, n_splits, n_active, kvh, tile, folds):
    dag = Dag()
    group = n_heads // n_kv
    rows = [kvh * group + r for r in range(tile * 16, min(group, tile * 16 + 16))]
    combine = Kernel(ptx, f"combine_harnessILi{head_dim}E")
    want = {}
    for qrow in rows:
        g = memory(dag, np.random.default_rng(1), n_heads, n_splits, head_dim, n_active)
        blk = Block(combine, dag, args((O,), (ACC,), (M,), (L,), (NPAST,), n_heads, n_kv, n_splits), g,
                    512, ctaid=(qrow, 0, 0)).run()
        want.update(outputs(blk))
    assert sorted(want) == [r * head_dim + e for r in rows for e in range(head_dim)]
    fold = Kernel(ptx, f"fold_harnessILi{head_dim}E")
    slot = kvh * -(-group // 16) + tile
    for cap in folds:
        nw = 1
        while nw < min(16, n_active):
            nw *= 2
        k = min(n_active, -(-len(rows) * 32 // (128 // nw)), cap)
        got = {}
        for rank in range(k):          # the last k arrivals: arrival a finds the counter at n_active - a
            a = n_active - k + rank
            g = memory(dag, np.random.default_rng(1), n_heads, n_splits, head_dim, n_active,
                       counter=(slot, 0 if a == 0 else n_active - a))
            blk = Block(fold, dag, args((O,), (ACC,), (M,), (L,), (CNT,), (NPAST,), n_heads, n_kv, n_splits, cap,
                                        kvh, tile, n_active), g, 128, settle=0 if n_active > 1 else None).run()
            for i, ids in outputs(blk).items():
                got.setdefault(i, []).extend(ids)
        assert sorted(got) == sorted(want), f"cap {cap}: outputs written"
        for i, ids in got.items():
            assert ids == want[i], f"cap {cap}, K {k}: o[{i}] written {len(ids)} times or by other arithmetic"


def test_the_graph_tells_orders_apart():
    """The comparison can fail: the same terms accumulated in another order are another expression."""
    dag = Dag()
    x, y, z, w, zero = (dag.node("leaf", i) for i in range(5))
    assert dag.node("fma", x, y, dag.node("fma", z, w, zero)) != dag.node("fma", z, w, dag.node("fma", x, y, zero))
    assert dag.node("fma", x, y, zero) == dag.node("fma", y, x, zero)
