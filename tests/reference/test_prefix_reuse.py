"""Prompt prefix reuse (ModelRunner.start, daemon/runner.py): a new prompt keeps the cached K/V
of its common prefix with the last prompt, in whole prefill chunks, and the logits and the cache
are bit for bit those of an empty context. Tolerance: none (exact equality): the kept chunks hold
what a fresh chunked prefill writes, and every computed chunk has the same inputs and shapes.

Each reuse case below is also run against a stale cache: if a write below the recorded prefix did
not shorten it, the kept slots would hold other tokens' K/V and the logits would differ.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
from flashd.daemon.speculative.draft_model import DraftModelDrafter
from flashd.daemon.speculative.ngram import NgramDrafter
from flashd.protocol.messages import SamplingParams

CHUNK = 16
MAX_CTX = 256
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def model(synthetic_model):
    ops = ReferenceOps()
    return ops, load_model(synthetic_model(), ops.load_weight)


@pytest.fixture
def make(model):
    ops, m = model

    def runner(reuse: bool = True) -> ModelRunner:
        r = ModelRunner(ops, m.config, m.weights, MAX_CTX, CHUNK)
        r.reuse_prefix = reuse
        return r

    return runner


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 200, n)]


def fresh(make, prompt):
    """(logits, cache K, cache V) of prompt's slots, from an empty context."""
    r = make(reuse=False)
    logits = r.start(prompt)
    n = len(prompt)
    return logits, r.cache.k[:, :n].copy(), r.cache.v[:, :n].copy()


def assert_same_as_fresh(make, runner, prompt, logits):
    want, k, v = fresh(make, prompt)
    n = len(prompt)
    np.testing.assert_array_equal(logits, want)
    np.testing.assert_array_equal(runner.cache.k[:, :n], k)
    np.testing.assert_array_equal(runner.cache.v[:, :n], v)


@pytest.mark.parametrize("first,common,second,kept", [
    (50, 40, 70, 32),      # diverges inside a chunk: the chunks before it are kept
    (48, 48, 48, 32),      # the same prompt again: its last chunk is recomputed for the logits
    (48, 48, 49, 48),      # the last prompt plus one token: every chunk of it is kept
    (40, 3, 60, 0),        # a shorter common prefix than one chunk
    (20, 20, 90, 16),      # a longer prompt that starts with the last one
])
def test_common_prefix_chunks_are_kept_and_the_result_is_exact(make, first, common, second, kept):
    a = tokens(first, 1)
    b = a[:common] + tokens(second - common, 2)
    r = make()
    r.start(a)
    logits = r.start(b)
    assert r.n_reused == kept and r.n_past == second
    assert_same_as_fresh(make, r, b, logits)


def test_generated_tokens_are_not_reused_and_the_next_turn_is_exact(make):
    """A chat's next prompt = the last prompt + the reply + more: only the last prompt's chunks are
    kept (the reply's K/V came from decode steps)."""
    r = make()
    prompt = tokens(37, 3)
    reply = [s.token for s in r.generate(prompt, GREEDY, 30)]
    turn = prompt + reply + tokens(10, 4)
    logits = r.start(turn)
    assert r.n_reused == 32
    assert_same_as_fresh(make, r, turn, logits)
    assert [s.token for s in r.generate(turn, GREEDY, 8)] == [s.token for s in make(False).generate(turn, GREEDY, 8)]


def test_a_write_below_the_recorded_prefix_shortens_it(make):
    """score and a bare reset + prefill write other tokens from slot 0: the next start must not keep
    the slots they overwrote (kept, the stale K/V would change the logits)."""
    r = make()
    prompt = tokens(60, 5)
    r.start(prompt)
    r.score(tokens(20, 6))                          # slots 0..19 now hold other tokens
    logits = r.start(prompt)
    assert r.n_reused == 0
    assert_same_as_fresh(make, r, prompt, logits)

    r.start(prompt)
    r.reset()
    r.n_past = 40                                   # what a drafter does: rewind, then write
    r.prefill(tokens(8, 7))                         # slots 40..47
    logits = r.start(prompt)
    assert r.n_reused == 32
    assert_same_as_fresh(make, r, prompt, logits)


def test_speculative_decoding_reuses_the_prefix_and_stays_exact(make):
    r = make()
    prompt = tokens(45, 8)
    want = [s.token for s in make(False).generate(prompt, GREEDY, 24)]
    for _ in range(2):
        dec = SpecDecoder(r, NgramDrafter(), SpecConfig("chain", 4))
        assert [s.token for s in dec.generate(prompt, GREEDY, 24)] == want
    assert r.n_reused == 32


def test_a_draft_model_keeps_its_own_cached_prefix(make):
    """The draft model's runner takes the prompt through start() as well: the next request reuses
    its chunks there too, and the output is still plain greedy decoding's."""
    target, drafter = make(), DraftModelDrafter(make(), "self")
    prompt = tokens(70, 10)
    want = [s.token for s in make(False).generate(prompt, GREEDY, 20)]
    for n_reused in (0, 64):
        dec = SpecDecoder(target, drafter, SpecConfig("chain", 3))
        assert [s.token for s in dec.generate(prompt, GREEDY, 20)] == want
        assert drafter.runner.n_reused == n_reused and target.n_reused == n_reused
        assert dec.stats.accepted > 0


def test_reuse_off_and_hidden_sinks_prefill_everything(make):
    prompt = tokens(50, 9)
    off = make(reuse=False)
    off.start(prompt)
    off.start(prompt)
    assert off.n_reused == 0
    on = make()
    on.start(prompt)
    seen = []
    on.start(prompt, hidden_sink=lambda layer, hidden: seen.append(layer))
    assert on.n_reused == 0 and seen


def test_an_empty_prompt_is_an_error(make):
    with pytest.raises(ValueError, match="at least one token"):
        make().start([])
