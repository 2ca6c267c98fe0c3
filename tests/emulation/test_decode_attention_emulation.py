"""CPU emulation of the split-K attention core (native/cuda/attention_splitk.cuh), checked against a
float64 softmax.

It mirrors what the kernels compute, with the same index formulas: the launcher's split count,
each split's chunk/tile schedule (chunks s, s + n_splits, ...; 64-slot tiles; 4 warps x 16 slots),
the per-warp online softmax in the log2 domain with q and P split into float16 hi + lo parts, the
merge of the warps' states, and the combine over the active splits (decode), or the single-split
normalisation with tree masks (masked attention). Catches schedule and merge errors without a GPU;
tests/gpu/test_attention_*.py check the kernels.
"""
import numpy as np
import pytest

TILE, WARPS, WARP_SLOTS, ROWS = 64, 4, 16, 16
N_SMS, SMEM_PER_SM, MAX_SPLITS = 132, 228 * 1024, 512
LOG2E = 1.4426950408889634


def smem_bytes(head_dim):
    """Cfg<HD>::SMEM_BYTES of the CUDA build."""
    stages = 2 if head_dim >= 256 else 3
    ld = head_dim + 8
    q_bytes = 2 * ROWS * ld * 2
    pipe = stages * 2 * TILE * ld * 2
    merge = WARPS * ROWS * (head_dim + 2) * 4
    return q_bytes + max(pipe, merge)


def n_splits_for(n_kv_heads, group, head_dim, max_ctx, chunk_len):
    """fd_attention_decode's launch: enough blocks to fill the GPU, at most one split per chunk."""
    blocks_per_sm = max(1, SMEM_PER_SM // (smem_bytes(head_dim) + 1024))
    row_tiles = -(-group // ROWS)
    target = blocks_per_sm * N_SMS // (n_kv_heads * row_tiles)
    cap = min((max_ctx - 1) // chunk_len + 1, MAX_SPLITS)
    return max(1, min(target, cap))


def effective_splits(n_splits, chunk_len, L, single_chunks=0):
    """splitk_kernel's ns: 1 for a row of at most single_chunks chunks (fd_tuning_t.attn_single_chunks: split 0
    takes every chunk, the combine skips the row), else the launch's split count."""
    return 1 if -(-L // chunk_len) <= single_chunks else n_splits


def split_warp_slots(split, n_splits, chunk_len, L, single_chunks=0):
    """The slot ranges the split's warps process, in order: [(warp, first slot), ...] or None when
    the split has no chunk at this depth (the block exits)."""
    n_chunks = -(-L // chunk_len)
    n_splits = effective_splits(n_splits, chunk_len, L, single_chunks)
    if split >= min(n_splits, n_chunks):
        return None
    tiles_per_chunk = chunk_len // TILE
    n_my_chunks = (n_chunks - split + n_splits - 1) // n_splits
    last_chunk = split + (n_my_chunks - 1) * n_splits
    last_tiles = min(tiles_per_chunk, (L - last_chunk * chunk_len + TILE - 1) // TILE)
    n_tiles = (n_my_chunks - 1) * tiles_per_chunk + last_tiles
    out = []
    for k in range(n_tiles):
        slot0 = (split + (k // tiles_per_chunk) * n_splits) * chunk_len + (k % tiles_per_chunk) * TILE
        for w in range(WARPS):
            if slot0 + w * WARP_SLOTS < L:
                out.append((w, slot0 + w * WARP_SLOTS))
    return out


@pytest.mark.parametrize("single_chunks", [0, 4])
@pytest.mark.parametrize("max_ctx,chunk_len,n_kv_heads,group,head_dim", [
    (32768, 256, 2, 6, 128), (32768, 64, 2, 7, 64), (1000, 64, 8, 1, 64), (300, 192, 2, 20, 128),
    (4096, 512, 4, 6, 256), (64, 64, 1, 16, 128),
])
def test_schedule_covers_every_visible_slot_once(max_ctx, chunk_len, n_kv_heads, group, head_dim, single_chunks):
    n_splits = n_splits_for(n_kv_heads, group, head_dim, max_ctx, chunk_len)
    assert 1 <= n_splits <= MAX_SPLITS
    rng = np.random.default_rng(max_ctx + chunk_len)
    for L in sorted({1, 2, 63, 64, 65, chunk_len, chunk_len + 1, max_ctx, *rng.integers(1, max_ctx + 1, 8)}):
        seen = np.zeros(max_ctx + TILE, int)
        n_active = 0
        for split in range(n_splits):
            steps = split_warp_slots(split, n_splits, chunk_len, L, single_chunks)
            if steps is None:
                continue
            n_active += 1
            for _, slot0 in steps:
                seen[slot0:slot0 + WARP_SLOTS] += 1
        assert (seen[:L] == 1).all(), f"L={L}: every visible slot exactly once"
        # slots >= L inside a warp's last 16 are masked out by the kernel; none past a tile is read
        single = -(-L // chunk_len) <= single_chunks
        assert n_active == (1 if single else min(n_splits, -(-L // chunk_len))), "the combine's n_active"
        if single:
            assert [s for _, s in split_warp_slots(0, n_splits, chunk_len, L, single_chunks)] == \
                list(range(0, L, WARP_SLOTS)), "a single row: split 0 walks the keys in order"


def split_hi_lo(x):
    hi = x.astype(np.float16)
    lo = (x - hi.astype(np.float32)).astype(np.float16)
    return hi, lo


def warp_scores(q_hi, q_lo, k_rows):
    """16 x 16 scores of one warp step: two float16 products accumulated in float32."""
    k32 = k_rows.astype(np.float32)
    return (q_hi.astype(np.float32) @ k32.T + q_lo.astype(np.float32) @ k32.T).astype(np.float32)


def emulate_block(q_rows, kc, vc, steps, visible):
    """One block: per-warp online softmax over its steps, then the merge of the 4 warps.
    q_rows (16, d) already scaled by scale * log2 e. Returns (m, l, o_unnormalised) per row."""
    q_hi, q_lo = split_hi_lo(q_rows)
    d = q_rows.shape[1]
    m = np.full((WARPS, ROWS), -np.inf, np.float32)
    l = np.zeros((WARPS, ROWS), np.float32)
    o = np.zeros((WARPS, ROWS, d), np.float32)
    for w, slot0 in steps:
        slots = np.arange(slot0, slot0 + WARP_SLOTS)
        inside = slots < kc.shape[0]
        k_rows = np.where(inside[:, None], kc[np.minimum(slots, kc.shape[0] - 1)], 0)
        v_rows = np.where(inside[:, None], vc[np.minimum(slots, vc.shape[0] - 1)], 0)
        s = warp_scores(q_hi, q_lo, k_rows)
        s = np.where(visible[:, np.minimum(slots, visible.shape[1] - 1)] & inside, s, -np.inf)
        m_new = np.maximum(m[w], s.max(axis=1))
        m_use = np.where(m_new == -np.inf, 0, m_new).astype(np.float32)
        alpha = np.exp2(m[w] - m_use).astype(np.float32)
        p = np.exp2(s - m_use[:, None]).astype(np.float32)
        l[w] = l[w] * alpha + p.sum(axis=1)
        p_hi, p_lo = split_hi_lo(p)
        o[w] = o[w] * alpha[:, None] + (p_hi.astype(np.float32) @ v_rows.astype(np.float32)
                                        + p_lo.astype(np.float32) @ v_rows.astype(np.float32))
        m[w] = m_new
    m_blk = m.max(axis=0)
    with np.errstate(invalid="ignore"):
        wt = np.where(m_blk == -np.inf, 0, np.exp2(m - m_blk)).astype(np.float32)
    return m_blk, (wt * l).sum(axis=0), (wt[:, :, None] * o).sum(axis=0)


def oracle(q, kc, vc, visible, scale):
    s = q.astype(np.float64) @ kc.astype(np.float64).T * scale
    s = np.where(visible, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
    return p @ vc.astype(np.float64)


@pytest.mark.parametrize("single_chunks", [0, 4])
@pytest.mark.parametrize("group,head_dim,max_ctx,chunk_len,n_past", [
    (6, 128, 4096, 256, 4095), (7, 64, 2000, 64, 1234), (6, 128, 4096, 64, 100), (1, 64, 300, 128, 0),
    (6, 128, 32768, 64, 200),
])
def test_split_k_decode_matches_float64(group, head_dim, max_ctx, chunk_len, n_past, single_chunks):
    """One KV head's group of query heads through splits, warps and the combine."""
    rng = np.random.default_rng(group * 1000 + n_past)
    kc = rng.standard_normal((max_ctx, head_dim)).astype(np.float16)
    vc = rng.standard_normal((max_ctx, head_dim)).astype(np.float16)
    q = (rng.standard_normal((group, head_dim)) * 2).astype(np.float32)
    scale = 1 / np.sqrt(head_dim)
    L = min(n_past + 1, max_ctx)
    visible = np.zeros((ROWS, max_ctx), bool)
    visible[:, :L] = True
    q_rows = np.zeros((ROWS, head_dim), np.float32)
    q_rows[:group] = q * np.float32(scale * LOG2E)
    n_splits = n_splits_for(2, group, head_dim, max_ctx, chunk_len)
    partial = []
    for split in range(n_splits):
        steps = split_warp_slots(split, n_splits, chunk_len, L, single_chunks)
        if steps is not None:
            partial.append(emulate_block(q_rows, kc, vc, steps, visible))
    # a single row: split 0's block is the whole row (normalised in the split kernel; the combine of one
    # partial below is the same normalisation)
    # combine_kernel: weights exp2(m_s - max m) over the active splits
    ms = np.stack([m for m, _, _ in partial])[:, :group]
    ls = np.stack([l for _, l, _ in partial])[:, :group]
    os_ = np.stack([o for _, _, o in partial])[:, :group]
    m_all = ms.max(axis=0)
    wt = np.exp2(ms - m_all).astype(np.float32)
    out = (wt[:, :, None] * os_).sum(axis=0) / (wt * ls).sum(axis=0)[:, None]
    expect = oracle(q, kc, vc, visible[:group], scale)
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=2e-5)


def test_masked_rows_over_tokens_and_tree_mask():
    """Masked mode: 16 rows = (token, head) pairs spanning tokens; new slots gated by the mask."""
    rng = np.random.default_rng(7)
    group, head_dim, n, n_past = 6, 64, 9, 150
    max_ctx = n_past + n + 5
    kc = rng.standard_normal((max_ctx, head_dim)).astype(np.float16)
    vc = rng.standard_normal((max_ctx, head_dim)).astype(np.float16)
    q = rng.standard_normal((n, group, head_dim)).astype(np.float32)
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    mask = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j], j = True, parent[j]
    L = n_past + n
    scale = 1 / np.sqrt(head_dim)
    n_rows = n * group
    out = np.empty((n_rows, head_dim))
    for row0 in range(0, n_rows, ROWS):
        rows = np.arange(row0, row0 + ROWS)
        token = np.where(rows < n_rows, rows // group, -1)
        q_rows = np.zeros((ROWS, head_dim), np.float32)
        valid = rows < n_rows
        q_rows[valid] = q[token[valid], rows[valid] % group] * np.float32(scale * LOG2E)
        visible = np.zeros((ROWS, max_ctx), bool)
        visible[:, :n_past] = True
        for r in range(ROWS):
            if token[r] >= 0:
                visible[r, n_past:L] = mask[token[r]]
        # one split covering everything: chunk_len = max_ctx rounded up to the tile
        chunk_len = -(-max_ctx // TILE) * TILE
        m, l, o = emulate_block(q_rows, kc, vc, split_warp_slots(0, 1, chunk_len, L), visible)
        out[rows[valid]] = (o / l[:, None])[valid]
    for i in range(n):
        vis = np.zeros(max_ctx, bool)
        vis[:n_past] = True
        vis[n_past:L] = mask[i]
        expect = oracle(q[i], kc, vc, np.broadcast_to(vis, (group, max_ctx)), scale)
        np.testing.assert_allclose(out[i * group:(i + 1) * group], expect, rtol=1e-4, atol=2e-5)


def test_hi_lo_split_keeps_float32_accuracy():
    """x = hi + lo in float16 is off by at most 2^-22 |x| + 2^-25 (lo's subnormal spacing): far below
    the attention tolerance for the scaled q (|q * scale * log2 e| ~ 0.1 .. 100) and P (<= 1)."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(100000) * 10 ** rng.uniform(-4, 3, 100000)).astype(np.float32)
    hi, lo = split_hi_lo(x)
    err = np.abs(hi.astype(np.float64) + lo.astype(np.float64) - x)
    assert (err <= 2.0 ** -22 * np.abs(x) + 2.0 ** -25).all()
