"""CPU emulation of native/cuda/gemm.cu's tensor-core path, checked against a float64 matmul.

Two layers, both with the kernel's own index formulas:
  - the warp primitives: the PTX ISA's fragment layouts of mma.sync m16n8k16 (A, B, C) and of
    ldmatrix.x4 (plain and .trans), written down once here from the ISA's tables (not from the
    kernel), and the lane address formulas the kernels feed to ldmatrix;
  - the launch: tile loop, the X (f32) and W (f16) cp.async ring with wait_group semantics (a
    copy lands only when the kernel waits for its group), each thread's conversion of the X chunks
    it copied into the f16 A tile, predication of boundary tiles, warp sub-tiles, the epilogue
    (bias, residual, SwiGLU) and the split-k variant's cluster reduction.
Shared memory is modelled as the kernel's flat arrays, poisoned with NaN, so a fragment read from
the wrong offset, a stage read before its copy landed, or an unpredicated boundary shows up as a
wrong or NaN output. tests/emulation/test_flash_tiling.py reuses the warp primitives.

Tolerance: the emulation multiplies the same f16-rounded operands as the oracle and accumulates in
float64, so the only difference is summation order: 1e-12 relative to sum |x||w|.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

WARP = 32
LANE = np.arange(WARP)
GRP, TIG = LANE // 4, LANE % 4          # PTX "groupID" and "threadID_in_group"


def f16(a):
    """Round to float16 (round to nearest even, as __floats2half2_rn) and widen to float64."""
    return np.asarray(a, dtype=np.float64).astype(np.float16).astype(np.float64)


# ---- PTX ISA fragment layouts for mma.m16n8k16 (.f16 A/B, .f32 C/D) ---------------------------
# Index arrays: [lane, register, half] -> matrix row / column.
_REG4 = np.arange(4)[None, :, None]
_REG2 = np.arange(2)[None, :, None]
_HALF = np.arange(2)[None, None, :]
A_ROW = np.broadcast_to(GRP[:, None, None] + 8 * (_REG4 % 2), (WARP, 4, 2))          # a0,a2: g; a1,a3: g+8
A_COL = np.broadcast_to(2 * TIG[:, None, None] + _HALF + 8 * (_REG4 // 2), (WARP, 4, 2))  # a2,a3: +8
B_ROW = np.broadcast_to(2 * TIG[:, None, None] + _HALF + 8 * _REG2, (WARP, 2, 2))   # k
B_COL = np.broadcast_to(GRP[:, None, None], (WARP, 2, 2))                           # n
C_ROW = np.broadcast_to(GRP[:, None] + 8 * (np.arange(4)[None, :] // 2), (WARP, 4))
C_COL = np.broadcast_to(2 * TIG[:, None] + np.arange(4)[None, :] % 2, (WARP, 4))


def mma_16816(d, a, b):
    """d (32, 4) + A @ B: A (16x16) from a (32, 4, 2), B (16x8) from b (32, 2, 2), D into (32, 4)."""
    A = np.empty((16, 16))
    A[A_ROW, A_COL] = a
    B = np.empty((16, 8))
    B[B_ROW, B_COL] = b
    return d + (A @ B)[C_ROW, C_COL]


def ldmatrix_x4(smem, addr, trans=False):
    """ldmatrix.sync.aligned.m8n8.x4[.trans].b16 over a flat shared array.

    addr (32,): the element offset lane l supplies, the start of row l % 8 of matrix l // 8 (8
    consecutive b16). Returns (32, 4, 2): register j of lane l holds row l // 4, elements
    2(l % 4) and 2(l % 4) + 1 of matrix j; with .trans, column l // 4, rows 2(l % 4) and 2(l % 4) + 1.
    """
    addr = np.asarray(addr)
    assert addr.shape == (WARP,) and np.all(addr % 8 == 0), "ldmatrix rows must be 16-byte aligned"
    assert addr.min() >= 0 and addr.max() + 8 <= smem.size, "ldmatrix row outside shared memory"
    j = np.arange(4)[None, :, None]
    h = np.arange(2)[None, None, :]
    lane = LANE[:, None, None]
    if not trans:
        src = addr[8 * j + lane // 4]                 # the lane that gave this row's address
        return smem[src + 2 * (lane % 4) + h]
    src = addr[8 * j + 2 * (lane % 4) + h]
    return smem[src + lane // 4]


# ---- the tensor-core path of gemm.cu ---------------------------------------------------------
GEMM_BK = 32
GEMM_LD = GEMM_BK + 8


@dataclass(frozen=True, slots=True)
class GemmTile:
    """GemmTile<BM, BN, WARPS_M, WARPS_N, SWIGLU, STAGES, ...> of gemm.cu."""
    bm: int
    bn: int
    warps_m: int
    warps_n: int
    swiglu: bool
    stages: int

    def __post_init__(self):
        assert self.wm % 16 == 0 and self.wn % 16 == 0
        assert self.bm * (GEMM_BK // 4) % self.n_threads == 0
        assert self.bn * (GEMM_BK // 8) % self.n_threads == 0

    n_w = property(lambda s: 2 if s.swiglu else 1)
    n_threads = property(lambda s: 32 * s.warps_m * s.warps_n)
    wm = property(lambda s: s.bm // s.warps_m)
    wn = property(lambda s: s.bn // s.warps_n)
    mi = property(lambda s: s.wm // 16)
    ni = property(lambda s: s.wn // 8)
    x_chunks = property(lambda s: s.bm * (GEMM_BK // 4) // s.n_threads)
    w_chunks = property(lambda s: s.bn * (GEMM_BK // 8) // s.n_threads)
    x_stage_floats = property(lambda s: s.bm * GEMM_BK)
    w_stage_halves = property(lambda s: s.n_w * s.bn * GEMM_LD)
    a_tile_halves = property(lambda s: s.bm * GEMM_LD)


# the kernel's configurations (gemm.cu: Tile128x128 ... SwiTile64x64), and a 2-stage ring
KERNEL_TILES = [GemmTile(128, 128, 2, 4, False, 3), GemmTile(64, 128, 2, 4, False, 4),
                GemmTile(64, 64, 2, 2, False, 4), GemmTile(128, 64, 4, 2, True, 3), GemmTile(64, 64, 2, 2, True, 4),
                GemmTile(64, 64, 2, 2, False, 2)]


class AsyncCopies:
    """cp.async with commit/wait_group: a copy is applied to shared memory only when waited for."""

    def __init__(self, smem):
        self.smem, self.groups, self.open = smem, [], []

    def copy16(self, dst, values):              # dst (threads,), values (threads, 8)
        self.open.append((dst[:, None] + np.arange(8), values))

    def commit(self):
        self.groups.append(self.open)
        self.open = []

    def wait(self, n_pending):
        while len(self.groups) > n_pending:
            for dst, values in self.groups.pop(0):
                self.smem[dst] = values


def silu(v):
    return v / (1.0 + np.exp(-v))


def emulate_gemm(cfg: GemmTile, x, w0, w1=None, bias=None, residual=None, n_split=1):
    """The whole launch: grid (ceil(m / BM), ceil(n / BN), n_split); n_split > 1 is the cluster
    split-k variant (gemm_f16_mma_kernel<T, true>)."""
    m, k = x.shape
    n = w0.shape[0]
    y = np.full((m, n), np.nan)
    tid = np.arange(cfg.n_threads)
    n_ktiles_total = -(-k // GEMM_BK)
    for bx in range(-(-m // cfg.bm)):
        for by in range(-(-n // cfg.bn)):
            accs = []
            for bz in range(n_split):
                kt_begin = n_ktiles_total * bz // n_split
                n_ktiles = n_ktiles_total * (bz + 1) // n_split - kt_begin
                accs.append(_emulate_gemm_block(cfg, bx, by, tid, x, (w0, w1), kt_begin, n_ktiles))
            if n_split == 1:
                _epilogue(cfg, bx, by, accs[0], bias, residual, y)
            else:
                _split_reduce(cfg, bx, by, tid, accs, bias, residual, y)
    return y


def _split_reduce(cfg, bx, by, tid, accs, bias, residual, y):
    """Each block of the cluster stores its partial tile [BM][BN + 8] in its shared memory; block
    `rank` sums rows rank * ceil(BM / S) .. of all partials in rank order."""
    assert not cfg.swiglu
    m, n = y.shape
    m0, n0 = bx * cfg.bm, by * cfg.bn
    red_ld = cfg.bn + 8
    parts = []
    for acc in accs:
        part = np.full(cfg.bm * red_ld, np.nan)
        for warp in range(cfg.warps_m * cfg.warps_n):
            warp_m, warp_n = warp // cfg.warps_n, warp % cfg.warps_n
            for mi in range(cfg.mi):
                for h in range(2):
                    for ni in range(cfg.ni):
                        off = (warp_m * cfg.wm + mi * 16 + GRP + 8 * h) * red_ld + warp_n * cfg.wn + ni * 8 + 2 * TIG
                        part[off] = acc[warp, 0, mi, ni, :, 2 * h]
                        part[off + 1] = acc[warp, 0, mi, ni, :, 2 * h + 1]
        parts.append(part)
    n_split = len(accs)
    rows_per = -(-cfg.bm // n_split)
    for rank in range(n_split):
        for start in range(0, rows_per * (cfg.bn // 4), cfg.n_threads):
            idx = start + tid
            idx = idx[idx < rows_per * (cfg.bn // 4)]
            row, col = rank * rows_per + idx // (cfg.bn // 4), (idx % (cfg.bn // 4)) * 4
            keep = (row < cfg.bm) & (m0 + row < m)
            row, col = row[keep], col[keep]
            total = np.zeros((len(row), 4))
            for r in range(n_split):
                total += parts[r][(row * red_ld + col)[:, None] + np.arange(4)]
            for e in range(4):
                gcol = n0 + col + e
                ok = gcol < n
                gr, gc = m0 + row[ok], gcol[ok]
                v = total[ok, e]
                if bias is not None:
                    v = v + bias[gc]
                if residual is not None:
                    v = v + residual[gr, gc]
                assert np.all(np.isnan(y[gr, gc])), "an output element written twice"
                y[gr, gc] = v


def _emulate_gemm_block(cfg, bx, by, tid, x, ws, kt_begin, n_ktiles):
    """One block's main loop over k-tiles kt_begin .. kt_begin + n_ktiles - 1; returns its
    accumulators acc[warp, weight, mi, ni, lane, 4]."""
    m, k = x.shape
    n = ws[0].shape[0]
    m0, n0 = bx * cfg.bm, by * cfg.bn
    x_ring = np.full(cfg.stages * cfg.x_stage_floats, np.nan)
    w_ring = np.full(cfg.stages * cfg.w_stage_halves, np.nan)
    a_smem = np.full(2 * cfg.a_tile_halves, np.nan)
    x_copies, w_copies = AsyncCopies(x_ring), AsyncCopies(w_ring)

    def load_tile(kt, stage):
        for i in range(cfg.x_chunks):
            c = tid + i * cfg.n_threads
            row, col = c // (GEMM_BK // 4), (c % (GEMM_BK // 4)) * 4
            gm, gk = m0 + row, (kt_begin + kt) * GEMM_BK + col
            ok = (gm < m) & (gk < k)
            v = np.zeros((len(tid), 8))                 # 16 bytes: 4 floats (padded to 8 slots here)
            v[ok, :4] = x[gm[ok, None], gk[ok, None] + np.arange(4)]
            dst = stage * cfg.x_stage_floats + row * GEMM_BK + col
            x_copies.open.append((dst[:, None] + np.arange(4), v[:, :4]))
        for wi in range(cfg.n_w):
            w = ws[wi]
            for i in range(cfg.w_chunks):
                c = tid + i * cfg.n_threads
                row, col = c // (GEMM_BK // 8), (c % (GEMM_BK // 8)) * 8
                gn, gk = n0 + row, (kt_begin + kt) * GEMM_BK + col
                ok = (gn < n) & (gk < k)
                v = np.zeros((len(tid), 8))      # cp.async zero-fill when !ok
                v[ok] = w[gn[ok, None], gk[ok, None] + np.arange(8)]
                w_copies.copy16(stage * cfg.w_stage_halves + (wi * cfg.bn + row) * GEMM_LD + col, v)

    def commit():
        x_copies.commit(), w_copies.commit()

    def wait(n_pending):
        x_copies.wait(n_pending), w_copies.wait(n_pending)

    def convert_x(stage, buf):
        for i in range(cfg.x_chunks):
            c = tid + i * cfg.n_threads
            row, col = c // (GEMM_BK // 4), (c % (GEMM_BK // 4)) * 4
            v = x_ring[(stage * cfg.x_stage_floats + row * GEMM_BK + col)[:, None] + np.arange(4)]
            a_smem[(buf * cfg.a_tile_halves + row * GEMM_LD + col)[:, None] + np.arange(4)] = f16(v)

    n_warps = cfg.warps_m * cfg.warps_n
    acc = np.zeros((n_warps, cfg.n_w, cfg.mi, cfg.ni, WARP, 4))

    def compute(a_buf, stage):
        for warp in range(n_warps):
            warp_m, warp_n = warp // cfg.warps_n, warp % cfg.warps_n
            a_tile = a_buf * cfg.a_tile_halves + (warp_m * cfg.wm) * GEMM_LD
            for kk in range(GEMM_BK // 16):
                bf = np.empty((cfg.n_w, cfg.ni, WARP, 2, 2))
                for wi in range(cfg.n_w):
                    b_tile = stage * cfg.w_stage_halves + (wi * cfg.bn + warp_n * cfg.wn) * GEMM_LD
                    for np_ in range(cfg.ni // 2):
                        r = ldmatrix_x4(w_ring, b_tile + (np_ * 16 + LANE % 8 + (LANE // 16) * 8) * GEMM_LD
                                        + kk * 16 + ((LANE // 8) % 2) * 8)
                        bf[wi, 2 * np_] = r[:, 0:2]
                        bf[wi, 2 * np_ + 1] = r[:, 2:4]
                for mi in range(cfg.mi):
                    af = ldmatrix_x4(a_smem, a_tile + (mi * 16 + LANE % 16) * GEMM_LD + kk * 16 + (LANE // 16) * 8)
                    for wi in range(cfg.n_w):
                        for ni in range(cfg.ni):
                            acc[warp, wi, mi, ni] = mma_16816(acc[warp, wi, mi, ni], af, bf[wi, ni])

    # pipeline, exactly as the kernel orders it
    for s in range(cfg.stages - 1):
        if s < n_ktiles:
            load_tile(s, s)
        commit()
    wait(cfg.stages - 2)
    convert_x(0, 0)
    for kt in range(n_ktiles):
        if kt + cfg.stages - 1 < n_ktiles:
            load_tile(kt + cfg.stages - 1, (kt + cfg.stages - 1) % cfg.stages)
        commit()
        compute(kt % 2, kt % cfg.stages)
        wait(cfg.stages - 2)
        if kt + 1 < n_ktiles:
            convert_x((kt + 1) % cfg.stages, (kt + 1) % 2)

    return acc


def _epilogue(cfg, bx, by, acc, bias, residual, y):
    m, n = y.shape
    m0, n0 = bx * cfg.bm, by * cfg.bn
    for warp in range(cfg.warps_m * cfg.warps_n):
        warp_m, warp_n = warp // cfg.warps_n, warp % cfg.warps_n
        for mi in range(cfg.mi):
            for h in range(2):
                row = m0 + warp_m * cfg.wm + mi * 16 + GRP + 8 * h
                for ni in range(cfg.ni):
                    for e in range(2):
                        col = n0 + warp_n * cfg.wn + ni * 8 + 2 * TIG + e
                        ok = (row < m) & (col < n)
                        r, c = row[ok], col[ok]
                        if cfg.swiglu:
                            v = silu(acc[warp, 0, mi, ni, ok, 2 * h + e]) * acc[warp, 1, mi, ni, ok, 2 * h + e]
                        else:
                            v = acc[warp, 0, mi, ni, ok, 2 * h + e].copy()
                            if bias is not None:
                                v += bias[c]
                            if residual is not None:
                                v += residual[r, c]
                        assert np.all(np.isnan(y[r, c])), "an output element written twice"
                        y[r, c] = v


# ---- tests: warp primitives ------------------------------------------------------------------
def test_fragment_layouts_cover_each_element_once():
    for rows, cols, shape in ((A_ROW, A_COL, (16, 16)), (B_ROW, B_COL, (16, 8)), (C_ROW, C_COL, (16, 8))):
        count = np.zeros(shape, int)
        np.add.at(count, (rows, cols), 1)
        assert np.all(count == 1)


def test_ldmatrix_fragments_reproduce_a_matmul():
    """A (16x16, [m][k]) and W (8x16 per n8 tile, [n][k]) in shared rows GEMM_LD apart, loaded with
    the kernel's lane address formulas, multiply to A @ W^T."""
    rng = np.random.default_rng(1)
    a = f16(rng.standard_normal((16, 16)))
    w = f16(rng.standard_normal((16, 16)))                 # two n8 tiles
    a_smem = np.full(16 * GEMM_LD, np.nan)
    w_smem = np.full(16 * GEMM_LD, np.nan)
    for r in range(16):
        a_smem[r * GEMM_LD:r * GEMM_LD + 16] = a[r]
        w_smem[r * GEMM_LD:r * GEMM_LD + 16] = w[r]
    af = ldmatrix_x4(a_smem, (LANE % 16) * GEMM_LD + (LANE // 16) * 8)
    r = ldmatrix_x4(w_smem, (LANE % 8 + (LANE // 16) * 8) * GEMM_LD + ((LANE // 8) % 2) * 8)
    out = np.empty((16, 16))
    for ni, b in enumerate((r[:, 0:2], r[:, 2:4])):
        d = mma_16816(np.zeros((WARP, 4)), af, b)
        tile = np.empty((16, 8))
        tile[C_ROW, C_COL] = d
        out[:, ni * 8:(ni + 1) * 8] = tile
    np.testing.assert_allclose(out, a @ w.T, rtol=1e-12, atol=1e-12)


def test_ldmatrix_trans_gives_b_fragments_of_a_row_major_kxn_matrix():
    """V (16 keys x 16 dims, [k][n] row-major) through ldmatrix.trans is the B operand of P @ V."""
    rng = np.random.default_rng(2)
    p = f16(rng.standard_normal((16, 16)))
    v = f16(rng.standard_normal((16, 16)))
    ld = 16 + 8
    v_smem = np.full(16 * ld, np.nan)
    for r in range(16):
        v_smem[r * ld:r * ld + 16] = v[r]
    pa = np.empty((WARP, 4, 2))
    pa[...] = p[A_ROW, A_COL]
    r = ldmatrix_x4(v_smem, (LANE % 16) * ld + (LANE // 16) * 8, trans=True)
    out = np.empty((16, 16))
    for dt, b in enumerate((r[:, 0:2], r[:, 2:4])):
        tile = np.empty((16, 8))
        tile[C_ROW, C_COL] = mma_16816(np.zeros((WARP, 4)), pa, b)
        out[:, dt * 8:(dt + 1) * 8] = tile
    np.testing.assert_allclose(out, p @ v, rtol=1e-12, atol=1e-12)


# ---- tests: the block emulation --------------------------------------------------------------
def _oracle(x16, w16s, bias, residual, swiglu):
    if swiglu:
        return silu(x16 @ w16s[0].T) * (x16 @ w16s[1].T)
    y = x16 @ w16s[0].T
    if bias is not None:
        y = y + bias
    if residual is not None:
        y = y + residual
    return y


@pytest.mark.parametrize("cfg", KERNEL_TILES, ids=lambda c: f"{c.bm}x{c.bn}w{c.warps_m}x{c.warps_n}"
                         + ("swiglu" if c.swiglu else ""))
@pytest.mark.parametrize("m,n,k", [(1, 7, 8), (17, 23, 72), (130, 67, 136)])
def test_gemm_emulation_matches_matmul(cfg, m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    x = rng.standard_normal((m, k))
    ws = [f16(rng.standard_normal((n, k))) for _ in range(cfg.n_w)]
    bias = None if cfg.swiglu else rng.standard_normal(n)
    residual = None if cfg.swiglu else rng.standard_normal((m, n))
    y = emulate_gemm(cfg, x, ws[0], ws[1] if cfg.swiglu else None, bias, residual)
    assert not np.isnan(y).any(), "an output element was never written (or read unwritten smem)"
    want = _oracle(f16(x), ws, bias, residual, cfg.swiglu)
    scale = np.abs(f16(x)) @ np.abs(np.stack(ws)).max(0).T + 1.0
    assert np.max(np.abs(y - want) / scale) < 1e-12


@pytest.mark.parametrize("n_split", [2, 3, 8])
@pytest.mark.parametrize("m,n,k", [(1, 7, 264), (130, 67, 520)])
def test_gemm_split_k_emulation_matches_matmul(m, n, k, n_split):
    """The cluster split-k variant (Tile128x128 only): uneven k shares, a share shorter than the
    ring, row slices of 128 / 3 = 43 rows, bias and residual applied once."""
    cfg = KERNEL_TILES[0]
    rng = np.random.default_rng(m + n + k + n_split)
    x = rng.standard_normal((m, k))
    w = f16(rng.standard_normal((n, k)))
    bias, residual = rng.standard_normal(n), rng.standard_normal((m, n))
    y = emulate_gemm(cfg, x, w, None, bias, residual, n_split=n_split)
    assert not np.isnan(y).any()
    want = _oracle(f16(x), [w], bias, residual, False)
    scale = np.abs(f16(x)) @ np.abs(w).T + np.abs(bias) + np.abs(residual) + 1.0
    assert np.max(np.abs(y - want) / scale) < 1e-12


def test_gemm_emulation_catches_a_wrong_stage_wait():
    """The cp.async model is strict enough to matter: waiting one group too few leaves a ring slot
    unread (NaN), which is what a wrong wait_group count would do on the GPU."""
    cfg = KERNEL_TILES[2]
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((5, 136)), f16(rng.standard_normal((9, 136)))
    original = AsyncCopies.wait
    try:
        AsyncCopies.wait = lambda self, n_pending: original(self, n_pending + 1)
        y = emulate_gemm(cfg, x, w)
    finally:
        AsyncCopies.wait = original
    assert np.isnan(y).any()
