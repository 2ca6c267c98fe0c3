"""CPU emulation of the folded split-K combine (native/cuda/attention_splitk_combine.cuh): the one-token
attention launches (fd_attention_decode, fd_attention_decode_rope) no longer launch combine_kernel; the
last split blocks of each query-row tile to finish merge the partials themselves (fold_combine).

Two things are emulated with the kernels' own index formulas:

* the order: combine_kernel's 16 combine warps x 32 lanes (combine_lane: warp w merges splits w, w + 16,
  ... in rounds of combine_unroll splits, with the pinned fma / mul sequence), then the 16 warps' states
  merged in warp order (combine_merge) -- against fold_combine's passes (K combining blocks, columns of
  (row, lane), threads taking warps w = t % nw, w + nw, ...). Both call the same two functions in the CUDA
  source; here the point is that the fold's enumeration computes every (row, lane, warp) state exactly
  once from the same inputs and merges every output dim exactly once in the same warp order, so the float32
  results are bitwise equal -- while a different order (a negative control) is not.
* the arrival counter: atomicDec(counter, n_active - 1) from an idle counter (0, or >= n_active, e.g.
  0xFFFFFFFF from a poisoned workspace), in any arrival order and over a sequence of launches (layers,
  graph replays) with varying n_active: arrival indices, the last K combiners, the waiters' release at 0,
  and the counter left idle at 0 without a reset step.

float32 arithmetic: fma as float32(float64 a * b + c) (a * b is exact in float64) and exp2 in float32 --
not the GPU's ex2.approx bits, but the same functions on both paths, which is what an order comparison
needs. tests/gpu/test_attention_decode_fold.py checks the kernels bit for bit on the GPU.
"""
import numpy as np
import pytest

COMBINE_WARPS = 16
THREADS = 128          # the split kernel's block (HIP: 64)
MAX_SPLITS = 512
ROWS = 16
F32 = np.float32
NEG_INF = F32(-np.inf)


def unroll(head_dim):
    return 8 if head_dim >= 256 else 13


def fma(a, b, c):
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def mul(a, b):
    return (np.float64(a) * np.float64(b)).astype(F32)


def exp2(x):
    return np.exp2(F32(x), dtype=F32)


def combine_lane(m_row, l_row, acc_row, n_active, w, lane, head_dim):
    """combine_lane<HD>: combine warp w's lane `lane` (dims lane * PL ..) over its splits."""
    pl, u_n = head_dim // 32, unroll(head_dim)
    m, l, a = NEG_INF, F32(0), np.zeros(pl, F32)
    for s0 in range(w, n_active, COMBINE_WARPS * u_n):
        ss = [s0 + u * COMBINE_WARPS for u in range(u_n)]
        ms = [m_row[s] if s < n_active else NEG_INF for s in ss]
        ls = [l_row[s] if s < n_active else F32(0) for s in ss]
        xs = [acc_row[s, lane * pl:(lane + 1) * pl] if s < n_active else np.zeros(pl, F32) for s in ss]
        mb = m
        for v in ms:
            mb = np.fmax(mb, v)
        if mb == NEG_INF:
            continue
        f, wt0 = exp2(m - mb), exp2(ms[0] - mb)
        l = fma(l, f, mul(wt0, ls[0]))
        a = fma(a, f, mul(wt0, xs[0]))
        for u in range(1, u_n):
            wt = exp2(ms[u] - mb)
            l = fma(wt, ls[u], l)
            a = fma(wt, xs[u], a)
        m = mb
    return m, l, a


def combine_merge(wm, wl, wa):
    """combine_merge: one dim from the 16 warps' (m, l, acc[dim]), warp order 0..15."""
    mx = NEG_INF
    for v in wm:
        mx = np.fmax(mx, v)
    lsum, acc = F32(0), F32(0)
    if mx != NEG_INF:
        for w in range(COMBINE_WARPS):
            wt = exp2(wm[w] - mx)
            lsum = fma(wt, wl[w], lsum)
            acc = fma(wt, wa[w], acc)
    return (acc / lsum).astype(F32) if lsum > 0 else F32(np.nan)


def combine_kernel(part, n_active, head_dim):
    """combine_kernel over rows: (rows, head_dim) float32."""
    m, l, acc = part
    out = np.empty((m.shape[0], head_dim), F32)
    pl = head_dim // 32
    for r in range(m.shape[0]):
        wm, wl, wa = np.empty(16, F32), np.empty(16, F32), np.empty((16, head_dim), F32)
        for w in range(COMBINE_WARPS):
            for lane in range(32):
                sm, sl, sa = combine_lane(m[r], l[r], acc[r], n_active, w, lane, head_dim)
                wm[w], wl[w] = sm, sl          # every lane of a warp computes the same m, l
                wa[w, lane * pl:(lane + 1) * pl] = sa
        for d in range(head_dim):
            out[r, d] = combine_merge(wm, wl, wa[:, d])
    return out


def fold_plan(rows, n_active, fold_cap, threads=THREADS):
    """fold_combine's pass geometry: (nw, cols, n_passes, k)."""
    nw = 1
    while nw < min(COMBINE_WARPS, n_active):
        nw *= 2
    cols = threads // nw
    n_cols = rows * 32
    n_passes = -(-n_cols // cols)
    return nw, cols, n_passes, min(n_active, n_passes, fold_cap)


def fold_combine(part, n_active, head_dim, fold_cap, threads=THREADS, warp_order=None):
    """fold_combine's passes over all K combining blocks (ranks 0..K-1; each runs passes rank, rank + K,
    ...). Returns (o, how often each output element was written, how often each (row, lane, warp) state
    was computed). warp_order: a permutation of the merge order (negative control), None = the kernel's."""
    m, l, acc = part
    rows, pl = m.shape[0], head_dim // 32
    nw, cols, n_passes, k = fold_plan(rows, n_active, fold_cap, threads)
    n_cols = rows * 32
    o = np.full((rows, head_dim), np.nan, F32)
    writes = np.zeros((rows, head_dim), int)
    states = np.zeros((rows, 32, COMBINE_WARPS), int)
    order = list(range(COMBINE_WARPS)) if warp_order is None else list(warp_order)
    for rank in range(k):
        for pass_ in range(rank, n_passes, k):
            c0 = pass_ * cols
            cm = np.zeros((cols, 16), F32)
            cl = np.zeros((cols, 16), F32)
            ca = np.zeros((cols, 16, pl), F32)
            for tid in range(threads):                  # phase 1: the combine lanes
                c = tid // nw
                col = c0 + c
                if col >= n_cols:
                    continue
                r, lane = col // 32, col % 32
                for w in range(tid % nw, COMBINE_WARPS, nw):
                    cm[c, w], cl[c, w], ca[c, w] = combine_lane(m[r], l[r], acc[r], n_active, w, lane, head_dim)
                    states[r, lane, w] += 1
            for e0 in range(0, cols * pl, threads):    # phase 2: the merge, thread e of the block
                for e in range(e0, min(e0 + threads, cols * pl)):
                    c, j = e // pl, e % pl
                    col = c0 + c
                    if col >= n_cols:
                        continue
                    r, lane = col // 32, col % 32
                    o[r, lane * pl + j] = combine_merge(cm[c, order], cl[c, order], ca[c, order, j])
                    writes[r, lane * pl + j] += 1
    return o, writes, states


def partials(rng, rows, n_splits, head_dim, ties=False):
    """A tile's partials as the split blocks write them: m (log2-domain max), l > 0, unnormalised acc."""
    m = (rng.standard_normal((rows, n_splits)) * 6).astype(F32)
    if ties:
        m[:, ::3] = m[:, :1]                           # equal maxima across splits
    l = rng.uniform(0.5, 40.0, (rows, n_splits)).astype(F32)
    acc = (rng.standard_normal((rows, n_splits, head_dim)) * l[..., None]).astype(F32)
    return m, l, acc


@pytest.mark.parametrize("head_dim,rows,n_active,fold_cap", [
    (64, 7, 1, 66),        # one split: combines alone, no counter
    (64, 7, 2, 66),        # nw 2: two rows a pass
    (128, 6, 3, 66),       # nw 4 (rounded up): one row a pass, more passes than combiners
    (128, 6, 5, 66),       # nw 8
    (128, 6, 16, 66),      # nw 16: every warp one split
    (128, 6, 17, 66),      # warp 0 two splits
    (128, 6, 132, 66),     # 1.5B at depth: 24 passes, 24 combiners
    (128, 1, 264, 3),      # two rounds per lane (13 x 16 = 208 < 264); a cap below the passes
    (256, 16, 40, 33),     # head_dim 256, a full row tile
    (256, 2, 140, 1),      # two rounds (8 x 16 = 128 < 140); one combiner does every pass
    (64, 3, 512, 8),       # MAX_SPLITS: three rounds
])
def test_fold_is_combine_kernels_order_bitwise(head_dim, rows, n_active, fold_cap):
    rng = np.random.default_rng(head_dim * 1000 + n_active)
    part = partials(rng, rows, n_active + 3, head_dim, ties=n_active % 2 == 1)   # + stale splits, never read
    for a in part:
        a[:, n_active:] = np.nan                       # a stale split read would show as NaN
    want = combine_kernel(part, n_active, head_dim)
    got, writes, states = fold_combine(part, n_active, head_dim, fold_cap)
    assert (writes == 1).all(), "every output element written exactly once"
    assert (states == 1).all(), "every (row, lane, warp) state computed exactly once"
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isfinite(got).all()


def test_fold_hip_block_of_two_warps():
    """HIP's split kernel has 64 threads: the same passes with fewer columns each, same bits."""
    rng = np.random.default_rng(7)
    part = partials(rng, 3, 20, 64)
    want = combine_kernel(part, 20, 64)
    got, writes, _ = fold_combine(part, 20, 64, 66, threads=64)
    assert (writes == 1).all()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_different_merge_order_is_seen():
    """Negative control: the comparison above can see an order change (warps merged 15..0)."""
    rng = np.random.default_rng(11)
    part = partials(rng, 2, 100, 128)
    want = combine_kernel(part, 100, 128)
    got, _, _ = fold_combine(part, 100, 128, 66, warp_order=range(15, -1, -1))
    assert not np.array_equal(got.view(np.uint32), want.view(np.uint32))


# ---- the arrival counter ----------------------------------------------------------------------------
def atomic_dec(counter, val):
    """CUDA atomicDec: ((old == 0) | (old > val)) ? val : old - 1; returns old."""
    old = counter[0]
    counter[0] = val if old == 0 or old > val else old - 1
    return old


def arrive_all(counter, n_active, k, rng):
    """One launch's arrivals in a random order. Returns (arrival index of each arrival in order, the
    combiners' ranks, for each arrival whether a waiter would be released right after it)."""
    order = rng.permutation(n_active)
    indices, ranks, released = [], {}, []
    for split in order:
        if n_active > 1:
            old = atomic_dec(counter, n_active - 1)
            a = 0 if old == 0 or old >= n_active else n_active - old
        else:
            a = 0                                       # alone: no counter
        indices.append(a)
        if a >= n_active - k:
            ranks[int(split)] = a - (n_active - k)
        released.append(counter[0] == 0)
    return indices, ranks, released


@pytest.mark.parametrize("idle", [0, 0xFFFFFFFF, MAX_SPLITS, 0x3F3F3F3F])
def test_counter_protocol_from_any_idle_value(idle):
    rng = np.random.default_rng(idle % 1000)
    counter = [idle]
    for launch in range(60):                           # layers / graph replays on one workspace
        n_active = int(rng.choice([1, 2, 3, 16, 17, 132, 264, MAX_SPLITS])) if launch else MAX_SPLITS
        k = int(min(n_active, rng.integers(1, 30)))
        indices, ranks, released = arrive_all(counter, n_active, k, rng)
        assert indices == list(range(n_active)), "arrival indices are the arrival order"
        assert sorted(ranks.values()) == list(range(k)), "the last K arrivals combine, one rank each"
        if n_active > 1:
            assert released == [False] * (n_active - 1) + [True], "waiters released exactly at the last arrival"
            assert counter[0] == 0, "left idle at 0: no reset step"
        else:
            assert counter[0] in (0, idle), "a single split does not touch the counter"


def test_counter_requirement_small_garbage_is_harmful():
    """Why a new workspace is zero-filled (flashd_attention.h): a stale small count (1..n_active-1) is not
    idle -- the protocol would pick the wrong last arrival."""
    indices, _, _ = arrive_all([5], 132, 24, np.random.default_rng(0))
    assert indices != list(range(132))


@pytest.mark.parametrize("n_kv_heads,group,sms", [(2, 6, 132), (4, 7, 132), (8, 8, 132), (1, 20, 132),
                                                  (2, 6, 16), (64, 1, 132), (40, 1, 20)])
def test_waiting_blocks_cannot_fill_the_gpu(n_kv_heads, group, sms):
    """enable_fold: fold = max(1, SMs // tiles); at most fold - 1 blocks of a tile wait, so all tiles'
    waiting blocks stay fewer than the SMs (each SM holds at least one block of the split kernel)."""
    tiles = n_kv_heads * -(-group // ROWS)
    fold = max(1, sms // tiles)
    assert tiles * (fold - 1) < sms
    rows = min(group, ROWS)
    for n_active in (2, 16, 132, MAX_SPLITS):
        *_, k = fold_plan(rows, n_active, fold)
        assert 1 <= k <= fold
