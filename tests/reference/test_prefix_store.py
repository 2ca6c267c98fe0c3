"""PrefixStore (daemon/prefix_cache.py): host copies of prompt prefixes under a byte budget, and the
runner using it so that interleaved prompts each keep their chunks. The restored K/V are the saved
bytes, so results are compared with a fresh prefill exactly (no tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.prefix_cache import PrefixStore, reusable_tokens
from flashd.daemon.runner import ModelRunner

CHUNK = 16


def kv(n_tokens: int, fill: float = 0.0) -> np.ndarray:
    return np.full((2, 1, n_tokens, 1, 4), fill, np.float32)      # 32 bytes per token


def test_reusable_tokens_counts_whole_chunks_of_the_common_prefix():
    a = list(range(100))
    assert reusable_tokens(a, a[:40] + [-1] * 30, CHUNK) == 32
    assert reusable_tokens(a, a, CHUNK) == 96                  # the last token is always forwarded
    assert reusable_tokens(a, a[:49], CHUNK) == 48
    assert reusable_tokens(a, a[:17], CHUNK) == 16
    assert reusable_tokens(a, a[:16], CHUNK) == 0
    assert reusable_tokens([], a, CHUNK) == 0
    assert reusable_tokens(a, [-1] + a[1:], CHUNK) == 0


def test_best_picks_the_snapshot_sharing_most_chunks():
    store = PrefixStore(1 << 20, CHUNK)
    a, b = list(range(64)), list(range(32)) + [-1] * 32
    assert store.add(a, kv(64)) and store.add(b, kv(64))
    snap, n = store.best(a[:50] + [7])
    assert snap.tokens == tuple(a) and n == 48
    snap, n = store.best(b + [1])
    assert snap.tokens == tuple(b) and n == 64
    assert store.best([-5] * 40) is None


def test_budget_evicts_the_least_recently_used():
    store = PrefixStore(64 * 32 * 2, CHUNK)                     # room for two 64-token snapshots
    a, b, c = ([i] * 64 for i in (1, 2, 3))
    store.add(a, kv(64)), store.add(b, kv(64))
    store.best(a + [0])                                       # a is now the most recently used
    store.add(c, kv(64))
    assert store.covers(a) and store.covers(c) and not store.covers(b)
    assert store.n_bytes == 2 * 64 * 32 and len(store) == 2
    assert store.info() == {"snapshots": 2, "tokens": 128, "bytes": 2 * 64 * 32, "max_bytes": 64 * 32 * 2}
    assert not store.add([4] * 160, kv(160))                  # larger than the whole budget
    assert not store.add([5] * 20, kv(20))                    # not whole chunks


def test_a_longer_prefix_replaces_its_own_prefixes():
    store = PrefixStore(1 << 20, CHUNK)
    a = list(range(96))
    store.add(a[:32], kv(32))
    store.add(a[:64], kv(64))
    assert len(store) == 1 and store.covers(a[:32]) and store.n_bytes == 64 * 32
    assert store.add(a[:48], kv(48)) and len(store) == 1          # covered: nothing added


def test_bad_budgets_are_errors():
    with pytest.raises(ValueError):
        PrefixStore(-1, CHUNK)
    with pytest.raises(ValueError):
        PrefixStore(10, 0)


# ---------------------------------------------------------------------------- the runner with a store

@pytest.fixture(scope="module")
def model(synthetic_model):
    ops = ReferenceOps()
    return ops, load_model(synthetic_model(), ops.load_weight)


def runner(model, store=None, reuse=True) -> ModelRunner:
    ops, m = model
    r = ModelRunner(ops, m.config, m.weights, 256, CHUNK)
    r.reuse_prefix, r.prefix_store = reuse, store
    return r


def tokens(n, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 200, n)]


def test_interleaved_prompts_each_keep_their_prefix_and_stay_exact(model):
    """A (a long conversation), B (a side request), A + more: the third keeps A's chunks from the
    store; the logits and the cache equal a fresh prefill's."""
    store = PrefixStore(1 << 30, CHUNK)
    r = runner(model, store)
    a, b = tokens(70, 1), tokens(40, 2)
    r.start(a)
    r.start(b)                                  # overwrites A's slots: A's 64 go to the store first
    assert store.covers(a[:64]) and r.n_reused == 0
    turn = a + tokens(9, 3)
    logits = r.start(turn)
    assert r.n_reused == 64
    fresh = runner(model, reuse=False)
    np.testing.assert_array_equal(logits, fresh.start(turn))
    n = len(turn)
    np.testing.assert_array_equal(r.cache.k[:, :n], fresh.cache.k[:, :n])
    np.testing.assert_array_equal(r.cache.v[:, :n], fresh.cache.v[:, :n])
    assert store.covers(b[:32])                 # B was saved before A's copy was loaded over it
    assert r.start(b + [5]).shape and r.n_reused == 32


def test_without_a_store_the_side_request_costs_the_prefix(model):
    r = runner(model)
    a = tokens(70, 1)
    r.start(a)
    r.start(tokens(40, 2))
    r.start(a + [1])
    assert r.n_reused == 0


def test_park_keeps_the_prefix_in_the_store(model):
    store = PrefixStore(1 << 30, CHUNK)
    r = runner(model, store)
    a = tokens(50, 4)
    r.start(a)
    r.keep_prefix()
    again = runner(model, store)                # what unpark builds: an empty cache, the same store
    logits = again.start(a + [3])
    assert again.n_reused == 48
    np.testing.assert_array_equal(logits, runner(model, reuse=False).start(a + [3]))
