"""Chunk selection (daemon/pflash/selection.py) against brute-force references."""
import itertools
import math

import numpy as np
import pytest

from flashd.daemon.pflash import selection as sel


def naive_smooth(x, width):
    half = width // 2
    return np.array([np.mean(x[max(0, j - half):j + half + 1]) for j in range(len(x))])


def naive_chunk_scores(x, chunk):
    return np.array([np.mean(x[s:s + chunk]) for s in range(0, len(x), chunk)])


def brute_force_best_subset(scores, keep):
    """The subset of ceil(keep * n) chunks (at least the first and the last) that contains both
    ends and maximises the total score -- over every combination (distinct scores: unique)."""
    n = len(scores)
    n_keep = max(math.ceil(round(keep * n, 9)), 1)
    forced = {0, n - 1}
    others = [c for c in range(n) if c not in forced]
    k = max(n_keep - len(forced), 0)
    best = max(itertools.combinations(others, k), key=lambda combo: sum(scores[c] for c in combo))
    return sorted(forced | set(best))


def rank_rule(scores, keep):
    """Kept iff forced, or fewer than (n_keep - #forced) other non-forced chunks beat it
    (higher score, or equal score and lower index)."""
    n = len(scores)
    n_keep = max(math.ceil(round(keep * n, 9)), 1)
    forced = {0, n - 1}
    slots = n_keep - len(forced)
    kept = []
    for c in range(n):
        if c in forced:
            kept.append(c)
            continue
        beaten_by = sum(1 for o in range(n) if o not in forced and o != c
                        and (scores[o] > scores[c] or (scores[o] == scores[c] and o < c)))
        if beaten_by < slots:
            kept.append(c)
    return kept


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12])
def test_select_chunks_equals_brute_force_on_distinct_scores(n, rng):
    for keep in (0.01, 0.2, 0.5, 0.75, 1.0):
        scores = rng.permutation(n).astype(np.float64) + rng.uniform(0, 0.5, n)
        assert list(sel.select_chunks(scores, keep)) == brute_force_best_subset(scores, keep), (n, keep)


def test_select_chunks_ties_follow_the_rank_rule(rng):
    for _ in range(200):
        n = int(rng.integers(1, 40))
        scores = rng.integers(0, 4, n).astype(np.float64)     # many ties
        keep = float(rng.uniform(0.01, 1.0))
        assert list(sel.select_chunks(scores, keep)) == rank_rule(scores, keep)


def test_keep_ratio_counts_exactly():
    # 0.05 * 20 = 1.0000000000000002 in floating point: still 1 chunk's worth, then first+last forced
    assert len(sel.select_chunks(np.arange(20.0), 0.05)) == 2
    assert len(sel.select_chunks(np.arange(100.0), 0.05)) == 5
    assert len(sel.select_chunks(np.arange(101.0), 0.05)) == 6
    assert list(sel.select_chunks(np.arange(5.0), 1.0)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        sel.select_chunks(np.arange(5.0), 0.0)


@pytest.mark.parametrize("n,width", [(1, 13), (5, 13), (13, 13), (100, 13), (37, 1), (50, 5)])
def test_smooth_matches_naive(n, width, rng):
    x = rng.uniform(size=n)
    np.testing.assert_allclose(sel.smooth(x, width), naive_smooth(x, width), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n,chunk", [(1, 32), (31, 32), (32, 32), (33, 32), (1000, 32), (77, 7)])
def test_chunk_scores_match_naive(n, chunk, rng):
    x = rng.uniform(size=n)
    np.testing.assert_allclose(sel.chunk_scores(x, chunk), naive_chunk_scores(x, chunk), rtol=1e-12)


def test_kept_positions_whole_pipeline_matches_naive(rng):
    for _ in range(30):
        n_tail, n = int(rng.integers(1, 9)), int(rng.integers(1, 700))
        probs = rng.uniform(size=(n_tail, n)) ** 4
        keep = float(rng.uniform(0.02, 1.0))
        importance = probs.mean(axis=0)
        scores = naive_chunk_scores(naive_smooth(importance, 13), 32)
        chunks = rank_rule(scores, keep)
        expect = [p for c in chunks for p in range(c * 32, min(n, c * 32 + 32))]
        got = sel.kept_positions(probs, keep, 32, 13)
        assert list(got) == expect
        assert list(got) == sorted(set(got))                  # ascending, no repeats


def test_a_planted_important_span_survives(rng):
    n = 4096
    probs = rng.uniform(0, 1e-4, size=(8, n))
    probs[:, 2000:2010] = 0.3                                  # the "needle"
    kept = set(sel.kept_positions(probs, 0.05, 32, 13).tolist())
    assert set(range(2000, 2010)) <= kept
    assert 0 in kept and n - 1 in kept


def test_more_forced_chunks_at_the_ends():
    scores = np.array([0.0, 9, 0, 0, 0, 8, 0, 0, 0, 0])
    assert list(sel.select_chunks(scores, 0.4, first=1, last=3)) == [0, 7, 8, 9]
    assert list(sel.select_chunks(scores, 0.5, first=1, last=3)) == [0, 1, 7, 8, 9]
    assert list(sel.select_chunks(scores, 0.1, first=2, last=2)) == [0, 1, 8, 9]    # forced may exceed keep
    assert list(sel.select_chunks(scores, 0.2, first=0, last=0)) == [1, 5]
    assert list(sel.select_chunks(np.array([1.0, 2.0]), 0.5, first=5, last=5)) == [0, 1]
