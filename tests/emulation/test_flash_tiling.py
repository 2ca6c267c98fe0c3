"""CPU emulation of native/cuda/attention_prefill.cu's tensor-core path (its key-tile loop is
attention_tile.cuh's, shared with attention_sparse.cu), checked against float64 causal attention over
a KV cache.

Lane-level, with the kernel's index formulas: flattened (token, head-in-group) rows, latest-first
block order, the visible-slot limits, which key tiles are visited and which are masked (only those
crossing the diagonal of the block's first row), the K/V cp.async ring with wait_group semantics, Q / K / V / P fragments through the PTX layouts (ldmatrix, ldmatrix.trans, mma from
tests/emulation/test_gemm_tiling.py), the exp2 online softmax with its all-masked guard, and the merge of the
key-split warps. Shared memory is the kernel's flat arrays poisoned with NaN.

Tolerances: with P kept in float64 (round_p=False) the emulation computes exactly the oracle's
function up to summation order: 1e-10. With P rounded to f16 as the kernel does, each weight
carries a relative error <= 2^-11, so the output moves by at most ~5e-4 of max |v|: 2e-3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tests.emulation.test_gemm_tiling import GRP, LANE, TIG, WARP, AsyncCopies, f16, ldmatrix_x4, mma_16816

FLASH_BKV = 64
LOG2E = 1.4426950408889634


@dataclass(frozen=True, slots=True)
class FlashCfg:
    """FlashCfg<HD, NQW, NKS, STAGES, ...> of attention_prefill.cu."""
    hd: int
    nqw: int
    nks: int
    stages: int
    bk: int = FLASH_BKV          # keys per tile (BK)
    qs: bool = False             # Q fragments by ldmatrix from a shared f16 Q tile (QS: head_dim 256)

    n_warps = property(lambda s: s.nqw * s.nks)
    n_threads = property(lambda s: 32 * s.n_warps)
    bq = property(lambda s: 16 * s.nqw)
    kw = property(lambda s: s.bk // s.nks)
    ld = property(lambda s: s.hd + 8)
    kv_tile_halves = property(lambda s: s.bk * s.ld)
    chunks = property(lambda s: s.bk * (s.hd // 8) // s.n_threads)


# launch_mma_for's NQW x NKS x STAGES choices, a 4-way key split, and a double buffer
KERNEL_CONFIGS = [(4, 1, 3), (4, 2, 4), (2, 4, 2)]
# head_dim 256's (launch_mma_for: wide, narrow float16 and narrow quantized ring depths), Q in shared memory
HD256_CONFIGS = [FlashCfg(256, 4, 2, 3, 32, True), FlashCfg(256, 2, 2, 2, 32, True), FlashCfg(256, 2, 2, 3, 32, True)]


def oracle(q16, k16, v16, p0, n_kv):
    """float64 causal attention: token i, head h attends slots [0, p0 + i] of kv head h // group."""
    n, n_heads, hd = q16.shape
    group = n_heads // n_kv
    out = np.zeros((n, n_heads, hd))
    for i in range(n):
        for h in range(n_heads):
            keys, values = k16[h // group, :p0 + i + 1], v16[h // group, :p0 + i + 1]
            s = keys @ q16[i, h] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[i, h] = p @ values / p.sum()
    return out


def emulate_attention(cfg: FlashCfg, q, k_cache, v_cache, p0, max_ctx, scale, round_p=True, stats=None):
    n, n_heads, hd = q.shape
    n_kv = k_cache.shape[0]
    assert hd == cfg.hd
    group = n_heads // n_kv
    n_rows = n * group
    n_blocks = -(-n_rows // cfg.bq)
    o = np.full((n, n_heads * hd), np.nan)
    for kvh in range(n_kv):
        for bx in range(n_blocks):
            _emulate_block(cfg, bx, n_blocks, kvh, q, k_cache, v_cache, p0, max_ctx, scale * LOG2E, round_p, o, stats)
    return o.reshape(n, n_heads, hd)


def _emulate_block(cfg, bx, n_blocks, kvh, q, k_cache, v_cache, p0, max_ctx, scale_log2, round_p, o, stats):
    n, n_heads, hd = q.shape
    n_kv = k_cache.shape[0]
    group = n_heads // n_kv
    n_rows = n * group
    row0 = (n_blocks - 1 - bx) * cfg.bq
    p0 = max(p0, 0)

    def last_slot(token):
        return np.minimum(p0 + token, max_ctx - 1)

    first_lim = last_slot(row0 // group)
    kv_len = int(last_slot(min(row0 + cfg.bq - 1, n_rows - 1) // group)) + 1
    n_tiles = -(-kv_len // cfg.bk)
    tid = np.arange(cfg.n_threads)
    k_flat, v_flat = k_cache.reshape(-1), v_cache.reshape(-1)
    ld, kw = cfg.ld, cfg.kw

    # per warp: Q fragments and visible limits
    qf = np.empty((cfg.n_warps, hd // 16, WARP, 4, 2))
    lim = np.empty((cfg.n_warps, 2, WARP), int)
    for warp in range(cfg.n_warps):
        wq = warp % cfg.nqw
        for h in range(2):
            r = np.minimum(row0 + wq * 16 + GRP + 8 * h, n_rows - 1)
            token, head = r // group, kvh * group + r % group
            lim[warp, h] = last_slot(token)
            for kk in range(hd // 16):
                cols = kk * 16 + 2 * TIG[:, None] + np.arange(2)
                qf[warp, kk, :, h] = f16(q[token[:, None], head[:, None], cols])
                qf[warp, kk, :, 2 + h] = f16(q[token[:, None], head[:, None], cols + 8])
    if cfg.qs:      # store_q_row's tile, read back by qk_tile_smem's ldmatrix: must be load_q_row's fragments
        q_smem = np.full(cfg.bq * ld, np.nan)
        for rb in range(cfg.bq):
            r = min(row0 + rb, n_rows - 1)
            q_smem[rb * ld:rb * ld + hd] = f16(q[r // group, kvh * group + r % group])
        for warp in range(cfg.n_warps):
            wq = warp % cfg.nqw
            for kk in range(hd // 16):
                a = ldmatrix_x4(q_smem, wq * 16 * ld + (LANE % 16) * ld + (LANE // 16) * 8 + kk * 16)
                np.testing.assert_array_equal(a, qf[warp, kk])
                qf[warp, kk] = a

    k_smem = np.full(cfg.stages * cfg.kv_tile_halves, np.nan)
    v_smem = np.full(cfg.stages * cfg.kv_tile_halves, np.nan)
    k_copies, v_copies = AsyncCopies(k_smem), AsyncCopies(v_smem)

    def load_kv(tile, stage):
        for i in range(cfg.chunks):
            c = tid + i * cfg.n_threads
            row, col = c // (hd // 8), (c % (hd // 8)) * 8
            slot = tile * cfg.bk + row
            ok = slot < kv_len
            off = (kvh * max_ctx + slot) * hd + col
            s_off = stage * cfg.kv_tile_halves + row * ld + col
            for copies, flat in ((k_copies, k_flat), (v_copies, v_flat)):
                vals = np.zeros((len(tid), 8))
                vals[ok] = flat[off[ok, None] + np.arange(8)]
                copies.copy16(s_off, vals)

    o_acc = np.zeros((cfg.n_warps, hd // 8, WARP, 4))
    m_run = np.full((cfg.n_warps, 2, WARP), -np.inf)
    l_run = np.zeros((cfg.n_warps, 2, WARP))

    def quad_max(v):                                  # __shfl_xor 1, 2 within groups of 4 lanes
        return v.reshape(8, 4).max(axis=1).repeat(4)

    for st in range(cfg.stages - 1):
        if st < n_tiles:
            load_kv(st, st)
        k_copies.commit(), v_copies.commit()
    for j in range(n_tiles):
        k_copies.wait(cfg.stages - 2), v_copies.wait(cfg.stages - 2)
        if j + cfg.stages - 1 < n_tiles:
            load_kv(j + cfg.stages - 1, (j + cfg.stages - 1) % cfg.stages)
        k_copies.commit(), v_copies.commit()
        masked = j * cfg.bk + cfg.bk - 1 > first_lim
        if stats is not None:
            stats["tiles"] += 1
            stats["masked"] += int(masked)
        for warp in range(cfg.n_warps):
            ks = warp // cfg.nqw
            k_tile = (j % cfg.stages) * cfg.kv_tile_halves + (ks * kw) * ld
            v_tile = (j % cfg.stages) * cfg.kv_tile_halves + (ks * kw) * ld
            s = np.zeros((kw // 8, WARP, 4))
            for kk in range(hd // 16):
                for np_ in range(kw // 16):
                    r = ldmatrix_x4(k_smem, k_tile + (np_ * 16 + LANE % 8 + (LANE // 16) * 8) * ld + kk * 16
                                    + ((LANE // 8) % 2) * 8)
                    s[2 * np_] = mma_16816(s[2 * np_], qf[warp, kk], r[:, 0:2])
                    s[2 * np_ + 1] = mma_16816(s[2 * np_ + 1], qf[warp, kk], r[:, 2:4])
            key0 = j * cfg.bk + ks * kw
            s *= scale_log2
            if masked:
                for ni in range(kw // 8):
                    for e in range(4):
                        key = key0 + ni * 8 + 2 * TIG + (e & 1)
                        s[ni, key > lim[warp, e >> 1], e] = -np.inf
            for h in range(2):
                tile_max = quad_max(s[:, :, 2 * h:2 * h + 2].max(axis=(0, 2)))
                m_new = np.maximum(m_run[warp, h], tile_max)
                m_ref = np.where(m_new == -np.inf, 0.0, m_new)
                alpha = np.exp2(m_run[warp, h] - m_ref)
                m_run[warp, h] = m_new
                s[:, :, 2 * h:2 * h + 2] = np.exp2(s[:, :, 2 * h:2 * h + 2] - m_ref[None, :, None])
                l_run[warp, h] = l_run[warp, h] * alpha + s[:, :, 2 * h:2 * h + 2].sum(axis=(0, 2))
                o_acc[warp, :, :, 2 * h:2 * h + 2] *= alpha[None, :, None]
            p = f16(s) if round_p else s
            for kc in range(kw // 16):
                pa = np.stack([p[2 * kc][:, 0:2], p[2 * kc][:, 2:4], p[2 * kc + 1][:, 0:2], p[2 * kc + 1][:, 2:4]], 1)
                for dp in range(hd // 16):
                    r = ldmatrix_x4(v_smem, v_tile + (kc * 16 + LANE % 16) * ld + dp * 16 + (LANE // 16) * 8,
                                    trans=True)
                    o_acc[warp, 2 * dp] = mma_16816(o_acc[warp, 2 * dp], pa, r[:, 0:2])
                    o_acc[warp, 2 * dp + 1] = mma_16816(o_acc[warp, 2 * dp + 1], pa, r[:, 2:4])

    l_run = l_run.reshape(cfg.n_warps, 2, 8, 4).sum(axis=3).repeat(4, axis=2)   # quad sums
    if cfg.nks == 1:
        for warp in range(cfg.n_warps):
            wq = warp % cfg.nqw
            for h in range(2):
                r = row0 + wq * 16 + GRP + 8 * h
                ok = r < n_rows
                token, head = r[ok] // group, kvh * group + r[ok] % group
                inv = 1.0 / l_run[warp, h, ok]
                for d in range(hd // 8):
                    for e in range(2):
                        idx = token * n_heads * hd + head * hd + d * 8 + 2 * TIG[ok] + e
                        _write(o, idx, o_acc[warp, d, ok, 2 * h + e] * inv)
        return
    # merge through shared memory, exactly as the kernel's last phase
    o_ld = hd + 8
    o_part = np.full(cfg.n_warps * 16 * o_ld, np.nan)
    ml = np.full(cfg.n_warps * 16 * 2, np.nan)
    for warp in range(cfg.n_warps):
        for h in range(2):
            rr = GRP + 8 * h
            for d in range(hd // 8):
                for e in range(2):
                    o_part[(warp * 16 + rr) * o_ld + d * 8 + 2 * TIG + e] = o_acc[warp, d, :, 2 * h + e]
            ml[((warp * 16 + rr) * 2)[TIG == 0]] = m_run[warp, h, TIG == 0]
            ml[((warp * 16 + rr) * 2 + 1)[TIG == 0]] = l_run[warp, h, TIG == 0]
    for idx in range(cfg.bq * (hd // 4)):   # every thread's share, in order
        rb, d = idx // (hd // 4), (idx % (hd // 4)) * 4
        r = row0 + rb
        if r >= n_rows:
            continue
        wq_r, rr = rb // 16, rb % 16
        ws = [sp * cfg.nqw + wq_r for sp in range(cfg.nks)]
        m_star = max(ml[(w * 16 + rr) * 2] for w in ws)
        m_ref = 0.0 if m_star == -np.inf else m_star
        f = [np.exp2(ml[(w * 16 + rr) * 2] - m_ref) for w in ws]
        l_star = sum(fi * ml[(w * 16 + rr) * 2 + 1] for fi, w in zip(f, ws))
        acc = sum(fi * o_part[(w * 16 + rr) * o_ld + d + np.arange(4)] for fi, w in zip(f, ws))
        token, head = r // group, kvh * group + r % group
        _write(o, token * n_heads * hd + head * hd + d + np.arange(4), acc / l_star)


def _write(o, flat_idx, values):
    flat = o.reshape(-1)
    assert np.all(np.isnan(flat[flat_idx])), "an output element written twice"
    flat[flat_idx] = values


def _inputs(rng, n, n_heads, n_kv, hd, p0, max_ctx):
    q = rng.standard_normal((n, n_heads, hd)) * 1.5
    k_cache = np.full((n_kv, max_ctx, hd), np.nan)      # slots past p0 + n - 1 are never written
    v_cache = np.full((n_kv, max_ctx, hd), np.nan)
    k_cache[:, :p0 + n] = f16(rng.standard_normal((n_kv, p0 + n, hd)))
    v_cache[:, :p0 + n] = f16(rng.standard_normal((n_kv, p0 + n, hd)))
    return q, k_cache, v_cache


@pytest.mark.parametrize("nqw,nks,stages", KERNEL_CONFIGS)
@pytest.mark.parametrize("n,n_heads,n_kv,p0", [(1, 2, 2, 0), (5, 6, 2, 3), (37, 3, 1, 70), (13, 7, 1, 130),
                                               (70, 2, 1, 0), (5, 4, 2, 62), (3, 1, 1, 63)])
def test_flash_emulation_matches_attention(nqw, nks, stages, n, n_heads, n_kv, p0):
    hd = 64
    rng = np.random.default_rng(n * 100 + n_heads + p0)
    max_ctx = p0 + n + 5
    q, k_cache, v_cache = _inputs(rng, n, n_heads, n_kv, hd, p0, max_ctx)
    want = oracle(f16(q), k_cache, v_cache, p0, n_kv)
    cfg = FlashCfg(hd, nqw, nks, stages)
    scale = 1 / np.sqrt(hd)
    exact = emulate_attention(cfg, q, k_cache, v_cache, p0, max_ctx, scale, round_p=False)
    assert not np.isnan(exact).any(), "an output element was never written (or read unwritten memory)"
    np.testing.assert_allclose(exact, want, rtol=1e-10, atol=1e-10)
    rounded = emulate_attention(cfg, q, k_cache, v_cache, p0, max_ctx, scale, round_p=True)
    np.testing.assert_allclose(rounded, want, rtol=0, atol=2e-3 * np.abs(v_cache[:, :p0 + n]).max())


def test_flash_emulation_head_dim_128():
    rng = np.random.default_rng(7)
    n, n_heads, n_kv, p0, hd = 9, 4, 2, 66, 128
    q, k_cache, v_cache = _inputs(rng, n, n_heads, n_kv, hd, p0, p0 + n)
    want = oracle(f16(q), k_cache, v_cache, p0, n_kv)
    for nqw, nks, stages in KERNEL_CONFIGS:
        got = emulate_attention(FlashCfg(hd, nqw, nks, stages), q, k_cache, v_cache, p0, p0 + n, 1 / np.sqrt(hd),
                                round_p=False)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("nqw,nks,stages", KERNEL_CONFIGS)
def test_flash_visits_only_needed_tiles_and_masks_only_the_diagonal(nqw, nks, stages):
    """With 300 slots of context and 40 tokens (G = 2: 80 rows, two or three blocks), a block
    visits ceil((p0 + last token + 1) / 64) tiles and masks only those past its first row's limit.
    (p0 = 62 and 63 in the attention test above put a first row's limit next to a tile edge.)"""
    rng = np.random.default_rng(11)
    n, n_heads, n_kv, p0, hd = 40, 2, 1, 300, 64
    q, k_cache, v_cache = _inputs(rng, n, n_heads, n_kv, hd, p0, p0 + n)
    cfg = FlashCfg(hd, nqw, nks, stages)
    stats = {"tiles": 0, "masked": 0}
    emulate_attention(cfg, q, k_cache, v_cache, p0, p0 + n, 0.125, stats=stats)
    want_tiles = want_masked = 0
    for row0 in range(0, n * 2, cfg.bq):
        first, last = p0 + row0 // 2, p0 + min(row0 + cfg.bq - 1, n * 2 - 1) // 2
        want_tiles += last // 64 + 1
        want_masked += last // 64 - (first + 1) // 64 + 1
    assert stats == {"tiles": want_tiles, "masked": want_masked}
    assert want_masked <= 2 * -(-n * 2 // cfg.bq)    # the diagonal spans at most two tiles per block


def test_flash_emulation_clamps_to_the_cache():
    """*n_past + n > max_ctx (a caller bug) must not read past the cache: the clamp keeps slots in
    [0, max_ctx) and every output finite."""
    rng = np.random.default_rng(5)
    n, n_heads, n_kv, hd, max_ctx = 6, 2, 1, 64, 8
    q = rng.standard_normal((n, n_heads, hd))
    k_cache = f16(rng.standard_normal((n_kv, max_ctx, hd)))
    v_cache = f16(rng.standard_normal((n_kv, max_ctx, hd)))
    got = emulate_attention(FlashCfg(hd, 4, 2, 4), q, k_cache, v_cache, 5, max_ctx, 0.125)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("cfg", HD256_CONFIGS, ids=lambda c: f"{c.nqw}x{c.nks}x{c.stages}")
@pytest.mark.parametrize("n,n_heads,n_kv,p0", [(5, 8, 2, 3), (13, 6, 1, 70), (9, 24, 4, 31)])
def test_flash_emulation_head_dim_256(cfg, n, n_heads, n_kv, p0):
    """head_dim 256's shapes (32-key tiles over 2 warps, Q from shared memory: the ldmatrix fragments are asserted
    equal to load_q_row's inside the emulation) against float64, GQA 4 and 6 with rows past a block's end."""
    rng = np.random.default_rng(n * 10 + n_heads + p0)
    hd = 256
    q, k_cache, v_cache = _inputs(rng, n, n_heads, n_kv, hd, p0, p0 + n + 3)
    want = oracle(f16(q), k_cache, v_cache, p0, n_kv)
    got = emulate_attention(cfg, q, k_cache, v_cache, p0, p0 + n + 3, 1 / np.sqrt(hd), round_p=False)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_head_dim_256_shapes_compute_each_row_alike():
    """Every head_dim 256 shape splits a tile's keys the same way (2 warps x 16 of 32), so a row's output is the
    same bits whichever shape (and so float16 or quantized loader) the launcher picks."""
    rng = np.random.default_rng(3)
    n, n_heads, n_kv, p0, hd = 21, 12, 2, 40, 256
    q, k_cache, v_cache = _inputs(rng, n, n_heads, n_kv, hd, p0, p0 + n)
    outs = [emulate_attention(cfg, q, k_cache, v_cache, p0, p0 + n, 1 / np.sqrt(hd)) for cfg in HD256_CONFIGS]
    for got in outs[1:]:
        np.testing.assert_array_equal(got, outs[0])
