"""CPU emulation of fd_sample's threshold logic (native/cuda/sampling_sample.cuh, sampling_select.cuh),
checked against flashd.daemon.sampling.

The emulation follows the kernel step by step -- order-preserving float keys, the 11/11/10-bit
radix selection with the 32-lane bin search of select_bin_from_top, 2^-40 fixed-point masses, the
per-thread-maximum lower bounds that filter candidates, the ascending-id walk over contiguous
per-thread ranges -- in float32 where the kernel is float32. It catches logic and indexing errors
without a GPU; tests/gpu/test_sampling_gpu.py checks the kernel itself.
"""
import numpy as np
import pytest

from flashd.daemon.sampling import sample, uniform
from flashd.protocol.messages import SamplingParams
from tests.sampling.sampling_boundaries import boundaries   # shared with the GPU sampler test

THREADS = 1024
CAND_CAP = 32768
FIX_ONE = 2.0 ** 40
LOG2_P_MIN = np.float32(-40.0)
LEVELS = ((21, 11), (10, 11), (0, 10))          # (shift, width) of the three radix digits


def f2key(x):
    u = np.asarray(x, np.float32).view(np.uint32)
    return np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)


def key2f(k):
    k = np.uint32(k)
    u = (k & np.uint32(0x7FFFFFFF)) if k & 0x80000000 else ~k
    return np.array([u], np.uint32).view(np.float32)[0]


def fix_of_bits(bits):
    """floor(p * 2^40) of float32 p given by its bits (the scaling is exact in float64)."""
    p = np.asarray(bits, np.uint32).view(np.float32).astype(np.float64)
    return np.floor(p * FIX_ONE).astype(np.uint64)


def select_bin_from_top(hist, target, above):
    """select_bin_from_top: 32 lanes own n_bins / 32 bins each; suffix sums over lanes, a ballot,
    then the chosen lane scans its bins from the top."""
    n_bins = hist.size
    per = n_bins // 32
    own = hist.reshape(32, per).sum(axis=1, dtype=np.uint64)
    suffix = np.cumsum(own[::-1], dtype=np.uint64)[::-1]
    total = int(suffix[0])
    target = min(int(target), int(above) + total)
    ok = [int(above) + int(s) >= target for s in suffix]
    assert ok == sorted(ok, reverse=True), "the lanes that reach the target form a prefix"
    lane = max((i for i, v in enumerate(ok) if v), default=0)
    acc = int(above) + int(suffix[lane]) - int(own[lane])
    bin_, bin_above = lane * per, acc
    for b in range(lane * per + per - 1, lane * per - 1, -1):
        if acc + int(hist[b]) >= target:
            bin_, bin_above = b, acc
            break
        acc += int(hist[b])
    return bin_, bin_above


def radix_select(keys, target, mass=False):
    """radix_select<MASS>: the largest key K with count (or fixed-point mass) of keys >= K >= target."""
    keys = np.asarray(keys, np.uint32)
    prefix, above = 0, 0
    for level, (shift, width) in enumerate(LEVELS):
        sel = keys if level == 0 else keys[(keys >> np.uint32(shift + width)) == prefix]
        digits = ((sel >> np.uint32(shift)) & np.uint32((1 << width) - 1)).astype(np.int64)
        hist = np.zeros(1 << width, np.uint64)
        np.add.at(hist, digits, fix_of_bits(sel) if mass else np.uint64(1))
        b, above = select_bin_from_top(hist, target, above)
        prefix = (prefix << width) | b
    return np.uint32(prefix)


def thread_of(n_vocab):
    """The kernel's strided element -> thread map (float4 groups when n_vocab % 4 == 0)."""
    ids = np.arange(n_vocab)
    return (ids // 4) % THREADS if n_vocab % 4 == 0 else ids % THREADS


def per_thread_max(values, n_vocab, init):
    out = np.full(THREADS, init, np.float32)
    np.maximum.at(out, thread_of(n_vocab), values)
    return out


def emulate_sample(logits, history, params, step):
    """fd_sample, step by step. Returns (token, stats) where stats records which paths ran."""
    stats = {}
    V = logits.size
    x = logits.astype(np.float32).copy()
    x[np.isnan(x)] = -np.inf
    f32 = np.float32
    penalties = params.repeat_last_n > 0 and (params.repeat_penalty != 1 or params.frequency_penalty != 0
                                              or params.presence_penalty != 0)
    if penalties:
        nh = len(history)
        w = min(params.repeat_last_n, nh)
        window = np.asarray(history[nh - w:], np.int64)
        window = window[(window >= 0) & (window < V)]
        ids, counts = np.unique(window, return_counts=True)
        for t, c in zip(ids, counts):
            v = x[t]
            if params.repeat_penalty != 1.0:
                v = v / f32(params.repeat_penalty) if v > 0 else v * f32(params.repeat_penalty)
            x[t] = (v - f32(c) * f32(params.frequency_penalty)) - f32(params.presence_penalty)
    tmax = per_thread_max(x, V, -np.inf)
    x_max = x.max()
    c2 = f32(1.4426950408889634 / params.temperature)

    def log2p(v):
        return (np.asarray(v, f32) - x_max) * c2

    theta = f32(-np.inf)
    small = False
    k = params.top_k if 0 < params.top_k < V else 0
    if k:
        lo = key2f(radix_select(f2key(tmax), k)) if k <= THREADS else f32(-np.inf)
        assert k > THREADS or (x >= lo).sum() >= k, "lo <= theta_k"
        cand = x[x >= lo] if (k <= THREADS or V <= CAND_CAP) else None
        if cand is not None and cand.size <= CAND_CAP:
            small = True
            theta = key2f(radix_select(f2key(cand), k))
        else:
            theta = key2f(radix_select(f2key(x), k))
        assert theta == np.partition(x, V - k)[V - k], "theta_k is the exact k-th largest"
    stats["small"] = small
    tau = f32(0.0)
    if small:
        kept_x = cand[(cand >= theta) & (log2p(cand) >= LOG2_P_MIN)]
        bits = np.exp2(log2p(kept_x)).astype(f32).view(np.uint32)
        total = int(fix_of_bits(bits).sum(dtype=np.uint64))
        if params.top_p < 1.0:
            target = int(np.ceil(float(f32(params.top_p)) * total))
            tau = np.array([radix_select(bits, target, mass=True)], np.uint32).view(f32)[0]
        p_all = None
    else:
        lp = log2p(x)
        p_all = np.where((x >= theta) & (lp >= LOG2_P_MIN), np.exp2(lp), 0).astype(f32)
        total_f = p_all.sum(dtype=f32)
        if params.top_p < 1.0:
            target = int(np.ceil(float(f32(params.top_p)) * float(total_f) * FIX_ONE))
            tmax_p = per_thread_max(p_all, V, 0.0)
            maxima_bits = tmax_p.view(np.uint32)
            lo = f32(0.0)
            if int(fix_of_bits(maxima_bits).sum(dtype=np.uint64)) >= target:
                lo = np.array([radix_select(maxima_bits[maxima_bits != 0], target, mass=True)],
                              np.uint32).view(f32)[0]
            if lo > 0:
                true_tau = np.array([radix_select(p_all[p_all > 0].view(np.uint32), target, mass=True)],
                                    np.uint32).view(f32)[0]
                assert true_tau >= lo, "lo <= tau"
            lo = max(lo, f32(params.min_p))          # only tau >= min_p can matter
            filt = lo > 0 or V <= CAND_CAP
            cand_p = p_all[(p_all > 0) & (p_all >= lo)] if filt else None
            stats["tau_overflow"] = cand_p is None or cand_p.size > CAND_CAP
            if stats["tau_overflow"]:
                tau = np.array([radix_select(p_all[p_all > 0].view(np.uint32), target, mass=True)],
                               np.uint32).view(f32)[0]
            elif int(fix_of_bits(cand_p.view(np.uint32)).sum(dtype=np.uint64)) >= target:
                tau = np.array([radix_select(cand_p.view(np.uint32), target, mass=True)], np.uint32).view(f32)[0]
    cut = max(tau, f32(params.min_p))

    if small:
        lp = log2p(x)
        p = np.where((x >= theta) & (lp >= LOG2_P_MIN), np.exp2(lp), 0).astype(f32)
    else:
        p = p_all
    kept = np.where((p > 0) & (p >= cut), p, f32(0))
    return walk(kept, params.seed, step), stats


def butterfly_sum(v):
    """The xor-shuffle reduction over 32 lanes (every lane ends with the same float32 sum)."""
    v = np.asarray(v, np.float32).copy()
    for o in (16, 8, 4, 2, 1):
        v = (v + v[np.arange(32) ^ o]).astype(np.float32)
    return v[0]


def walk(kept, seed, step):
    """The draw: warp w owns ids [w * seg, (w + 1) * seg), read in chunks of 32 lanes x W ids."""
    f32 = np.float32
    V = kept.size
    W = 4 if V % 4 == 0 else 1
    seg = -(-V // (32 * 32 * W)) * 32 * W

    def chunk_values(w, c):            # (32, W): each lane's kept p of chunk c
        out = np.zeros((32, W), f32)
        seg_end = min(V, (w + 1) * seg)
        for lane in range(32):
            i = w * seg + c * 32 * W + lane * W
            if i < seg_end:
                out[lane] = kept[i:i + W]
        return out

    def lane_pairs(v):                  # (v.x + v.y) + (v.z + v.w), the missing components 0
        v4 = np.zeros((32, 4), f32)
        v4[:, :v.shape[1]] = v
        return ((v4[:, 0] + v4[:, 1]).astype(f32) + (v4[:, 2] + v4[:, 3]).astype(f32)).astype(f32)

    n_chunks = [max(0, -(-(min(V, (w + 1) * seg) - w * seg) // (32 * W))) for w in range(32)]
    totals = []
    for w in range(32):
        own = np.zeros(32, f32)
        for c in range(n_chunks[w]):
            own = (own + lane_pairs(chunk_values(w, c))).astype(f32)
        totals.append(butterfly_sum(own))
    excl, total = [], f32(0)
    for t in totals:
        excl.append(total)
        total = f32(total + t)
    u = uniform(seed, step)
    thr = f32(u * float(total))
    if not thr < total:
        thr = np.nextafter(total, f32(0))
    owners = [w for w in range(32) if totals[w] > 0 and excl[w] <= thr < f32(excl[w] + totals[w])]
    assert len(owners) == 1, "exactly one warp holds the crossing"
    w = owners[0]
    running, last_kept = excl[w], -1
    for c in range(n_chunks[w]):
        v = chunk_values(w, c)
        mine = lane_pairs(v)
        chunk = butterfly_sum(mine)
        base = w * seg + c * 32 * W + np.arange(32) * W
        lane_last = np.array([base[l] + max(np.flatnonzero(v[l] > 0)) if (v[l] > 0).any() else -1
                              for l in range(32)])
        chunk_last = lane_last[lane_last >= 0].max() if (lane_last >= 0).any() else -1
        if f32(running + chunk) > thr:
            scan = mine.copy()
            for o in (1, 2, 4, 8, 16):                     # Hillis-Steele, as __shfl_up_sync
                shifted = np.concatenate([np.zeros(o, f32), scan[:-o]])
                scan = np.where(np.arange(32) >= o, scan + shifted, scan).astype(f32)
            cross = np.flatnonzero((mine > 0) & ((running + scan).astype(f32) > thr))
            if cross.size == 0:
                return chunk_last
            l = cross[0]
            acc = f32(f32(running + scan[l]) - mine[l])
            for e in range(W):
                if v[l, e] > 0:
                    acc = f32(acc + v[l, e])
                    if acc > thr:
                        return base[l] + e
            return lane_last[l]
        running = f32(running + chunk)
        if chunk_last >= 0:
            last_kept = chunk_last
    return last_kept


# -- radix selection -----------------------------------------------------------------------------
def test_radix_select_count_is_the_kth_largest():
    rng = np.random.default_rng(0)
    for trial in range(40):
        n = int(rng.integers(1, 5000))
        x = (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3)).astype(np.float32)
        if trial % 3 == 0:
            x = rng.integers(-3, 4, n).astype(np.float32)          # heavy ties
        x[rng.random(n) < 0.05] = -np.inf
        k = int(rng.integers(1, n + 1))
        got = key2f(radix_select(f2key(x), k))
        assert got == np.sort(x)[::-1][k - 1]


def test_radix_select_mass_is_the_top_p_threshold():
    rng = np.random.default_rng(1)
    for trial in range(40):
        n = int(rng.integers(1, 3000))
        p = np.exp(rng.standard_normal(n) * 3).astype(np.float32)
        p /= p.max()
        if trial % 4 == 0:
            p = np.round(p * 4).astype(np.float32) / 4 + np.float32(0.25)   # ties
        bits = p.view(np.uint32)
        m = fix_of_bits(bits)
        total = int(m.sum(dtype=np.uint64))
        target = int(rng.integers(1, total + 1))
        tau = np.array([radix_select(bits, target, mass=True)], np.uint32).view(np.float32)[0]
        # brute force: the largest value v of p with mass(p >= v) >= target
        vals = np.unique(p)[::-1]
        expect = next(v for v in vals if int(m[p >= v].sum(dtype=np.uint64)) >= target)
        assert tau == expect


def test_unreachable_target_selects_the_smallest_value():
    """The reference clamps top_p's cut to the last sorted entry: keep everything."""
    p = np.array([0.5, 0.25, 1.0], np.float32)
    tau = np.array([radix_select(p.view(np.uint32), 10 ** 18, mass=True)], np.uint32).view(np.float32)[0]
    assert tau == np.float32(0.25)


# -- the whole selection against the reference ----------------------------------------------------
def _f32(v):
    return float(np.float32(v))


@pytest.mark.parametrize("n_vocab", [50_000, 4096, 1001, 7])
def test_emulated_sampler_matches_reference(n_vocab):
    rng = np.random.default_rng(n_vocab)
    n_exact = 0
    small_seen = set()
    for case in range(40):
        kind = case % 3
        if kind == 0:
            logits = rng.standard_normal(n_vocab) * 2.0
            spikes = rng.choice(n_vocab, size=min(20, n_vocab), replace=False)
            logits[spikes] += rng.uniform(4, 12, spikes.size)
        elif kind == 1:
            logits = rng.standard_normal(n_vocab) * 0.05
        else:
            logits = rng.integers(-6, 7, n_vocab).astype(np.float64)
        logits = logits.astype(np.float32)
        history = rng.integers(0, n_vocab, int(rng.integers(0, 200))).astype(np.int32)
        params = SamplingParams(
            temperature=_f32(rng.choice([0.3, 0.7, 1.0, 1.6])),
            top_k=int(rng.choice([0, 1, 7, 40, 1000, 2000])),
            top_p=_f32(rng.choice([1.0, 0.95, 0.9, 0.5])),
            min_p=_f32(rng.choice([0.0, 0.05])),
            repeat_penalty=_f32(rng.choice([1.0, 1.3])),
            repeat_last_n=int(rng.choice([0, 64])),
            frequency_penalty=_f32(rng.choice([0.0, 0.5])),
            presence_penalty=_f32(rng.choice([0.0, 0.75])),
            seed=int(rng.integers(0, 2**62)),
        )
        step = int(rng.integers(0, 2**31 - 1))
        got, stats = emulate_sample(logits, history, params, step)
        small_seen.add(stats["small"])
        border, loose = boundaries(logits, history, params, step)
        if border:
            assert loose[got], f"case {case}: {got} outside every kept set float32 rounding allows"
        else:
            assert got == sample(logits, history, params, step), f"case {case}: {params}"
            n_exact += 1
    assert n_exact >= 15, f"only {n_exact} of 40 cases were away from float32 boundaries"
    if n_vocab > CAND_CAP:
        assert small_seen == {True, False}, "both the candidate path and the whole-vocabulary path ran"
