"""Test drafters and helpers shared by the spec tests (dense targets: test_spec_decode.py, hybrid targets:
test_spec_hybrid.py): `OracleDrafter` knows the target's greedy output and hides it at a random rank among
random tokens (long accepts, off-spine paths, so the commit really moves rows), `RandomDrafter` proposes noise
(nothing accepted)."""
from __future__ import annotations

import contextlib

import numpy as np

from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
from flashd.daemon.speculative.drafter import Drafter, Proposal
from flashd.protocol.messages import SamplingParams

GREEDY = SamplingParams()


class OracleDrafter(Drafter):
    """Knows the full greedy continuation `truth` (after the prompt); puts the true token at a
    random rank among K per depth, with its log-prob tied or worse than decoys half the time."""

    name = "oracle"

    def __init__(self, truth: list[int], vocab: int, seed: int, max_depth: int = 12):
        self.truth, self.vocab, self.max_depth = truth, vocab, max_depth
        self.rng = np.random.default_rng(seed)
        self.n_done = 0

    def begin(self, prompt, root):
        self.n_done = 1                              # root = truth[0]

    def propose(self, max_depth, top_k):
        rows_t, rows_lp = [], []
        for d in range(min(max_depth, self.max_depth, len(self.truth) - self.n_done)):
            true = self.truth[self.n_done + d]
            decoys = [t for t in self.rng.choice(self.vocab, top_k + 1, replace=False) if t != true][:top_k - 1]
            row = decoys[:]
            row.insert(int(self.rng.integers(0, top_k)), true)
            rows_t.append(row)
            rows_lp.append(-np.sort(self.rng.uniform(0, 1, top_k)))
        return Proposal(np.array(rows_t).reshape(-1, top_k), np.array(rows_lp).reshape(-1, top_k))

    def accept(self, accepted, bonus, rows=None):
        assert [self.truth[self.n_done + i] for i in range(len(accepted))] == list(accepted)
        self.n_done += len(accepted) + 1


class RandomDrafter(Drafter):
    name = "random"

    def __init__(self, vocab: int, seed: int):
        self.vocab, self.rng = vocab, np.random.default_rng(seed)

    def begin(self, prompt, root):
        pass

    def propose(self, max_depth, top_k):
        return Proposal(self.rng.integers(0, self.vocab, (max_depth, top_k)), -self.rng.uniform(0, 2, (max_depth, top_k)))

    def accept(self, accepted, bonus, rows=None):
        pass


def plain(runner, prompt, n, params=GREEDY, logprobs=0):
    return list(runner.generate(prompt, params, n, logprobs))


def spec(runner, drafter, mode, budget, prompt, n, params=GREEDY, logprobs=0):
    dec = SpecDecoder(runner, drafter, SpecConfig(mode, budget))
    out = list(dec.generate(prompt, params, n, logprobs))
    return out, dec.stats


@contextlib.contextmanager
def recording_kv_compact(target):
    """Within the block, every `target.ops.kv_compact` call's offsets are appended to the yielded list (an instance
    attribute wraps the real op: this block only), so a test can see that a commit really moved K/V rows."""
    moved: list[list[int]] = []
    real = target.ops.kv_compact

    def spy(cache, n_past, offsets):
        moved.append(list(offsets))
        real(cache, n_past, offsets)

    target.ops.kv_compact = spy
    try:
        yield moved
    finally:
        del target.ops.kv_compact
