"""Speculative decoding on a hybrid (qwen35) target is exact at temperature 0: token for token plain greedy
decoding, on the reference backend (the verify forward gives the Gated DeltaNet layers a state per tree node and
the commit keeps the accepted node's: models/qwen35_tree.py).

Drafters: the n-gram drafter, a hybrid draft model (2 layers of the target's seed: its recurrent state is cut back
through ModelRunner.checkpoint / rewind) and a dense one sharing the vocabulary, in chain, tree and auto modes;
the oracle drafter (accept-all chain steps, off-spine tree paths) and the random one (every step rejects all); a
synthetic DFlash drafter reading the hybrid target's layer features (its random weights get nothing accepted: it
checks that the features' capture in the verify forward works on a hybrid and changes no token).
Prefix reuse after speculative decoding keeps the prompt's chunk-boundary state: a chat turn's logits are a fresh
prefill's, bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.speculative.dflash_drafter import load_dflash_drafter
from flashd.daemon.speculative.draft_model import DraftModelDrafter
from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter
from flashd.protocol.messages import SamplingParams
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

from tests.speculative.spec_drafters import OracleDrafter, RandomDrafter, plain, recording_kv_compact, spec
from tests.speculative.spec_models import DRAFT, HYBRID_DRAFT, HYBRID_TARGET

VOCAB = HYBRID_TARGET["vocab_size"]
N_GEN = 32
PROMPTS = [
    [5, 9, 77, 12, 5, 9, 77, 12, 100, 200],          # repetitive: n-grams find matches
    [42],                                             # a one-token prompt
    list(range(260, 300)),                            # longer than a prefill chunk (16): a marked state copy
]


@pytest.fixture(scope="module")
def target(make_runner):
    return make_runner(HYBRID_TARGET, prefill_chunk=16)


@pytest.fixture(scope="module")
def drafters(make_runner):
    return {"ngram": lambda: NgramDrafter(NgramConfig(min_ngram=1)),
            "hybrid-draft": lambda: DraftModelDrafter(make_runner(HYBRID_DRAFT, prefill_chunk=16), "hybrid-draft"),
            "dense-draft": lambda: DraftModelDrafter(make_runner(DRAFT, prefill_chunk=16), "dense-draft")}


@pytest.mark.parametrize("mode,budget", [("chain", 4), ("ddtree", 8), ("ddtree", 22), ("auto", 6)])
@pytest.mark.parametrize("kind", ["ngram", "hybrid-draft", "dense-draft"])
def test_spec_equals_plain_greedy_on_a_hybrid_target(target, drafters, kind, mode, budget):
    drafter = drafters[kind]()
    total_accepted = 0
    for prompt in PROMPTS:
        want = [s.token for s in plain(target, prompt, N_GEN)]
        got, stats = spec(target, drafter, mode, budget, prompt, N_GEN)
        assert [s.token for s in got] == want, (kind, prompt, stats)
        assert stats.accepted + stats.steps + 1 == len(want)
        total_accepted += stats.accepted
    assert total_accepted > 0, "nothing was accepted: the test would not test the commit of a path"


def test_accept_all_chain_steps(target):
    """A chain of true tokens only (top_k = 1: the oracle's one candidate is the truth): every step accepts its
    whole chain, so the committed state is always the deepest node's."""
    for i, prompt in enumerate(PROMPTS):
        want = [s.token for s in plain(target, prompt, N_GEN)]
        got, stats = spec(target, OracleDrafter(want, VOCAB, seed=i, max_depth=5), "chain", 5, prompt, N_GEN)
        assert [s.token for s in got] == want
        assert stats.histogram[5] >= 5 and sum(stats.histogram[:5]) <= 2, stats.histogram


def test_off_spine_paths(target):
    """The oracle hides the truth at a random rank: accepted paths leave the spine, kv_compact moves their K/V
    and the state kept is an off-spine node's."""
    with recording_kv_compact(target) as moved:
        for i, prompt in enumerate(PROMPTS):
            want = [s.token for s in plain(target, prompt, N_GEN)]
            got, stats = spec(target, OracleDrafter(want, VOCAB, seed=i), "ddtree", 16, prompt, N_GEN)
            assert [s.token for s in got] == want and stats.accepted > 0
    assert moved, "no off-spine path was committed"


def test_reject_all_steps(target):
    for prompt in PROMPTS:
        want = [s.token for s in plain(target, prompt, N_GEN)]
        got, stats = spec(target, RandomDrafter(VOCAB, 1), "ddtree", 12, prompt, N_GEN)
        assert [s.token for s in got] == want
        assert stats.accepted == 0 and stats.steps == N_GEN - 1


def test_penalties_and_logprobs_on_a_hybrid_target(target, drafters):
    params = SamplingParams(repeat_penalty=1.3, repeat_last_n=16, presence_penalty=0.2)
    want = plain(target, PROMPTS[0], N_GEN, params, logprobs=2)
    for mode in ("chain", "ddtree"):
        got, _ = spec(target, drafters["hybrid-draft"](), mode, 8, PROMPTS[0], N_GEN, params, logprobs=2)
        assert [s.token for s in got] == [s.token for s in want]
        for a, b in zip(got, want):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


def test_a_chat_turn_after_speculative_decoding_keeps_the_prompts_state(make_runner, target):
    """Speculative decoding after a 40-token prompt (chunk 16: the state copy at 32) leaves that copy alone: the
    next turn (old prompt + answer + new message) keeps 32 tokens and gives a fresh prefill's logits, bit for bit."""
    old = PROMPTS[2]
    want = [s.token for s in plain(target, old, N_GEN)]
    got, stats = spec(target, OracleDrafter(want, VOCAB, seed=3), "ddtree", 8, old, N_GEN)
    assert [s.token for s in got] == want and stats.accepted > 0
    turn = old + [s.token for s in got] + [7, 8, 9]
    logits = target.start(turn)
    assert target.n_reused == 32
    fresh = make_runner(HYBRID_TARGET, prefill_chunk=16)
    fresh.reuse_prefix = False
    np.testing.assert_array_equal(logits, fresh.start(turn))
    for a, b in zip(target.cache.save_state(), fresh.cache.save_state()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_a_dflash_drafter_on_a_hybrid_target(target, tmp_path_factory, mode):
    cfg = HYBRID_TARGET
    dspec = spec_for_target(cfg["hidden"], cfg["n_layers"], VOCAB, n_features=2, block_size=8, n_layers=1,
                            head_dim=16, ffn=128, seed=5)
    path = write_synthetic_dflash(tmp_path_factory.mktemp("dflash-hybrid") / "drafter.gguf", dspec)
    drafter = load_dflash_drafter(path, target.ops, target.cfg, target.weights, target.max_ctx)
    for prompt in PROMPTS[:2]:
        want = [s.token for s in plain(target, prompt, N_GEN)]
        got, stats = spec(target, drafter, mode, 6, prompt, N_GEN)
        assert [s.token for s in got] == want and stats.steps > 0


def test_sampling_on_a_hybrid_target_runs_and_is_reproducible(target, drafters):
    """Temperature > 0 walks the same verified tree (rejection sampling: its distribution is checked on dense
    targets by test_spec_sampling.py; the hybrid's node logits are the decode steps' by test_qwen35_tree_commit.py):
    the same seed gives the same tokens, every one in the vocabulary."""
    params = SamplingParams(temperature=0.8, top_k=20, seed=7)
    runs = [[s.token for s in spec(target, drafters["hybrid-draft"](), "ddtree", 8, PROMPTS[0], N_GEN, params)[0]]
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == N_GEN and all(0 <= t < VOCAB for t in runs[0])
