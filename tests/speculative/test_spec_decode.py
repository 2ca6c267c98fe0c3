"""Speculative decoding is exact at temperature 0: token for token the output of plain greedy
decoding (daemon/speculative/decoder.py), on the reference backend with tiny synthetic models.

Drafters: the n-gram drafter, a 1-layer synthetic draft model sharing the target's vocabulary,
and two test drafters that stress the commit (spec_drafters.py): `OracleDrafter` (long accepts,
off-spine paths, so kv_compact really moves rows) and `RandomDrafter` (nothing accepted).
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
from flashd.daemon.speculative.drafter import Proposal
from flashd.daemon.speculative.draft_model import DraftModelDrafter
from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter
from flashd.daemon.speculative.policy import DepthPolicy, PolicyConfig
from flashd.protocol.messages import SamplingParams

from tests.speculative.spec_drafters import GREEDY, OracleDrafter, RandomDrafter, plain, recording_kv_compact, spec
from tests.speculative.spec_models import DRAFT, TARGET

PENALISED = SamplingParams(repeat_penalty=1.3, repeat_last_n=16, presence_penalty=0.2)
PROMPTS = [
    [5, 9, 77, 12, 5, 9, 77, 12, 100, 200],          # repetitive: n-grams find matches
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
    [42],                                             # a one-token prompt
    list(range(260, 300)),
]


@pytest.fixture(scope="module")
def target(make_runner):
    return make_runner(TARGET)


@pytest.fixture(scope="module")
def draft_runner(make_runner):
    return make_runner(DRAFT)


@pytest.mark.parametrize("mode,budget", [("chain", 1), ("chain", 4), ("chain", 16), ("ddtree", 3), ("ddtree", 8),
                                         ("ddtree", 22), ("ddtree", 40), ("auto", 6)])
@pytest.mark.parametrize("kind", ["ngram", "draft-model"])
def test_spec_equals_plain_greedy(target, draft_runner, kind, mode, budget):
    drafter = (NgramDrafter(NgramConfig(min_ngram=1)) if kind == "ngram"
               else DraftModelDrafter(draft_runner, "draft"))
    total_accepted = 0
    for prompt in PROMPTS:
        want = [s.token for s in plain(target, prompt, 48)]
        got, stats = spec(target, drafter, mode, budget, prompt, 48)
        assert [s.token for s in got] == want, (prompt, stats)
        total_accepted += stats.accepted
        assert stats.accepted + stats.steps + 1 == len(want)      # every step emits accepted + 1
    assert total_accepted > 0, "the drafter never got a token accepted: the test would not test acceptance"


@pytest.mark.parametrize("mode,budget", [("chain", 6), ("ddtree", 8), ("ddtree", 30)])
def test_oracle_drafter_long_accepts_and_off_spine_commits(target, mode, budget):
    with recording_kv_compact(target) as moved:
        run_oracle(target, mode, budget)
    if mode == "ddtree":
        assert moved, "no off-spine path was committed: kv_compact never moved a row"


def run_oracle(target, mode, budget):
    for i, prompt in enumerate(PROMPTS):
        want = [s.token for s in plain(target, prompt, 60)]
        got, stats = spec(target, OracleDrafter(want, TARGET["vocab_size"], seed=i), mode, budget, prompt, 60)
        assert [s.token for s in got] == want
        assert stats.accepted > 0, stats


def test_random_drafter_changes_nothing(target):
    for prompt in PROMPTS:
        want = [s.token for s in plain(target, prompt, 30)]
        got, _ = spec(target, RandomDrafter(TARGET["vocab_size"], 1), "ddtree", 16, prompt, 30)
        assert [s.token for s in got] == want


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 13])
def test_max_tokens_is_exact_mid_step(target, n):
    """A step that could emit more than the remaining count never does: output length == n."""
    prompt = PROMPTS[0]
    want = [s.token for s in plain(target, prompt, n)]
    truth = [s.token for s in plain(target, prompt, 64)]
    for budget in (4, 22):
        got, _ = spec(target, OracleDrafter(truth, TARGET["vocab_size"], seed=n), "ddtree", budget, prompt, n)
        assert [s.token for s in got] == want and len(got) == n


def test_context_end_shrinks_the_tree(make_runner):
    """prompt + max_tokens == max_ctx: the last steps must fit the tree in the slots left."""
    small = make_runner(TARGET, max_ctx=40, prefill_chunk=16)
    prompt = PROMPTS[1]
    n = 40 - len(prompt)
    want = [s.token for s in plain(small, prompt, n)]
    got, _ = spec(small, OracleDrafter(want, TARGET["vocab_size"], seed=4), "ddtree", 40, prompt, n)
    assert [s.token for s in got] == want
    assert small.n_past <= 40


def test_penalties_and_logprobs_follow_plain_decoding(target, draft_runner):
    prompt = PROMPTS[0]
    want = plain(target, prompt, 40, PENALISED, logprobs=3)
    for mode in ("chain", "ddtree"):
        got, _ = spec(target, DraftModelDrafter(draft_runner, "draft"), mode, 8, prompt, 40, PENALISED, logprobs=3)
        assert [s.token for s in got] == [s.token for s in want]
        # logprobs come from the tree forward's logits: same math, float32 rows in a different
        # batch shape, so equal to ~1e-5 (float32 rounding of logits of size ~10), not bit-exact
        for a, b in zip(got, want):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_drafter_end_runs_when_the_consumer_stops_early(target):
    ended = []

    class Tracking(NgramDrafter):
        def end(self):
            ended.append(True)
            super().end()

    dec = SpecDecoder(target, Tracking(NgramConfig(min_ngram=1)), SpecConfig("ddtree", 8))
    gen = dec.generate(PROMPTS[0], GREEDY, 40)
    next(gen), next(gen)
    gen.close()
    assert ended == [True]


def test_drafter_errors_propagate_and_end_still_runs(target):
    ended = []

    class Broken(NgramDrafter):
        def propose(self, max_depth, top_k):
            raise RuntimeError("drafter bug")

        def end(self):
            ended.append(True)

    with pytest.raises(RuntimeError, match="drafter bug"):
        list(SpecDecoder(target, Broken(), SpecConfig("chain", 4)).generate(PROMPTS[0], GREEDY, 10))
    assert ended == [True]
    # the runner serves plain decoding normally afterwards
    assert [s.token for s in plain(target, PROMPTS[2], 5)] == [s.token for s in plain(target, PROMPTS[2], 5)]


def test_undrafted_steps_take_the_runners_plain_step(target):
    """A step with nothing drafted (no n-gram match) is one greedy_stream of the root, not a
    one-node verify forward; with penalties (host-side argmax) it stays a verify forward."""
    calls = {"plain": 0, "tree": 0}

    class Spy:
        def __init__(self, runner):
            self._runner = runner

        def __getattr__(self, name):
            return getattr(self._runner, name)

        def __setattr__(self, name, value):
            if name == "_runner":
                object.__setattr__(self, name, value)
            else:
                setattr(self._runner, name, value)

        def greedy_stream(self, feed, n_new):
            calls["plain"] += 1
            return self._runner.greedy_stream(feed, n_new)

        def forward_tree(self, *args, **kwargs):
            calls["tree"] += 1
            return self._runner.forward_tree(*args, **kwargs)

    spy = Spy(target)
    prompt = PROMPTS[3]                                  # no repeats: the n-gram drafter rarely matches
    want = [s.token for s in plain(target, prompt, 40)]
    got, stats = spec(spy, NgramDrafter(), "chain", 4, prompt, 40)
    assert [s.token for s in got] == want
    assert calls["plain"] > 0 and calls["plain"] + calls["tree"] == stats.steps
    calls.update(plain=0, tree=0)
    want = [s.token for s in plain(target, prompt, 20, PENALISED)]
    got, stats = spec(spy, NgramDrafter(), "chain", 4, prompt, 20, PENALISED)
    assert [s.token for s in got] == want
    assert calls["plain"] == 0 and calls["tree"] == stats.steps


class ModeledCostPolicy(DepthPolicy):
    """A DepthPolicy that sees a modeled step cost (1 + 0.5 d units for d drafted tokens, the GPU's
    shape: each verify row costs) instead of the measured wall time, which on the CPU reference
    backend is noise-dominated (a verify of d + 1 rows can cost no more than a plain step there), so
    the depths it picks depend only on the acceptance it sees."""

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        super().observe(drafted, accepted, 1.0 + 0.5 * drafted)


def test_auto_mode_learns_across_requests_and_stays_exact(target):
    """spec=auto with a drafter that is always right drafts deep chains once measured; with one
    that is always wrong it settles on plain steps (exploring now and then); the output is plain
    greedy decoding's either way."""
    prompt = PROMPTS[1]
    want = [s.token for s in plain(target, prompt, 60)]
    good = ModeledCostPolicy(6)
    for _ in range(3):
        dec = SpecDecoder(target, OracleDrafter(want, TARGET["vocab_size"], seed=1, max_depth=6), SpecConfig("auto", 6),
                          good)
        assert [s.token for s in dec.generate(prompt, GREEDY, 60)] == want
    assert good.accept_prob(1) > 0.9
    assert dec.stats.accepted / dec.stats.steps > 2          # deep chains, mostly accepted
    bad = ModeledCostPolicy(6, PolicyConfig(explore_every=4))
    for seed in range(3):
        dec = SpecDecoder(target, RandomDrafter(TARGET["vocab_size"], seed), SpecConfig("auto", 6), bad)
        assert [s.token for s in dec.generate(prompt, GREEDY, 60)] == want
    assert bad.accept_prob(1) < 0.2
    assert dec.stats.drafted_nodes < dec.stats.steps / 2      # mostly plain steps


@contextmanager
def recorded_bursts(runner):
    """The n_new of every greedy_continue call on `runner` (the plain runs' bursts) while the block runs."""
    bursts = []
    original = runner.greedy_continue

    def recording(feed, n_new):
        bursts.append(n_new)
        return original(feed, n_new)

    runner.greedy_continue = recording
    try:
        yield bursts
    finally:
        del runner.greedy_continue


def test_auto_mode_runs_plain_steps_in_bursts(target):
    """Once the policy settles on plain steps it runs them as bursts of greedy_continue(n > 1) --
    one host round trip per burst, not per token -- and the output is still plain greedy's."""
    prompt = PROMPTS[0]
    want = [s.token for s in plain(target, prompt, 48)]
    with recorded_bursts(target) as bursts:
        policy = ModeledCostPolicy(6, PolicyConfig(explore_every=8))
        dec = SpecDecoder(target, RandomDrafter(TARGET["vocab_size"], 3), SpecConfig("auto", 6), policy)
        assert [s.token for s in dec.generate(prompt, GREEDY, 48)] == want
    assert max(bursts) > 1 and sum(bursts) > 24                 # most tokens came from bursts
    assert dec.stats.steps == 47 - dec.stats.accepted            # every plain token counted as a step


class PatchyOracle(OracleDrafter):
    """Right whenever it proposes, but it proposes only every third time asked (an n-gram drafter without a match
    the rest of the time); plain runs (skip) advance it like accepted tokens."""

    name = "patchy"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked = 0

    def propose(self, max_depth, top_k):
        self.asked += 1
        return super().propose(max_depth, top_k) if self.asked % 3 == 0 else Proposal.empty()

    def skip(self, tokens):
        self.n_done += len(tokens)


def test_auto_mode_asks_again_after_an_empty_draft(target):
    """spec=auto whose policy wants drafts (they are always accepted) but whose drafter often has none: each such
    step is one plain step and the next token asks the drafter again -- no plain burst that would skip the tokens
    where it has a draft (n-gram auto ran at 1.03-1.10x where a fixed chain ran at 1.15-1.20x, session 32). The
    output is plain greedy decoding's."""
    prompt = PROMPTS[1]
    want = [s.token for s in plain(target, prompt, 60)]
    policy = ModeledCostPolicy(6, PolicyConfig(explore_every=8))
    for _ in range(2):                           # the first request measures; the second runs on what it learned
        with recorded_bursts(target) as bursts:
            drafter = PatchyOracle(want, TARGET["vocab_size"], seed=4, max_depth=6)
            dec = SpecDecoder(target, drafter, SpecConfig("auto", 6), policy)
            assert [s.token for s in dec.generate(prompt, GREEDY, 60)] == want
    assert policy.accept_prob(1) > 0.8
    assert bursts and max(bursts) == 1            # every undrafted step alone: the drafter was asked at each token
    assert dec.stats.accepted > 20                # and its drafts were taken whenever it had one


def test_spec_config_is_checked():
    for bad in (dict(mode="tree", budget=4), dict(mode="chain", budget=0), dict(mode="ddtree", budget=4, top_k=0)):
        with pytest.raises(ValueError):
            SpecConfig(**bad)


def test_kv_compact_reference(make_runner):
    runner = make_runner(TARGET, max_ctx=32)
    cache = runner.cache
    rng = np.random.default_rng(0)
    cache.k[:] = rng.standard_normal(cache.k.shape)
    cache.v[:] = rng.standard_normal(cache.v.shape)
    k0, v0 = cache.k.copy(), cache.v.copy()
    offsets = np.array([0, 2, 3, 7])
    runner.ops.kv_compact(cache, 10, offsets)
    assert np.array_equal(cache.k[:, 10:14], k0[:, 10 + offsets])
    assert np.array_equal(cache.v[:, 10:14], v0[:, 10 + offsets])
    untouched = np.ones(32, bool)
    untouched[10:14] = False
    assert np.array_equal(cache.k[:, untouched], k0[:, untouched])
    assert np.array_equal(cache.v[:, untouched], v0[:, untouched])
