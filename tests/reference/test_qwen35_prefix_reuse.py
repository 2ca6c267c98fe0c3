"""Prefix reuse on a hybrid (qwen35) model (ModelRunner.start, daemon/runner.py): the recurrent state cannot be cut
back, so start() keeps a copy of it at the last whole-chunk boundary of each prompt it prefills, and a new prompt
keeps the cached K/V and that state only when its common prefix with the last prompt reaches that boundary (an
old prompt extended by an answer and a new message); anything else prefills from slot 0.

Tolerance: none (exact equality) against an empty context with reuse off. The kept K/V and state are what a
fresh chunked prefill computes at that boundary (same tokens, same chunks), and the tokens after it are
prefilled in the same chunks as a fresh prefill does. The state after decode steps (the recurrent form of the
delta rule, equal to the chunked one only up to rounding: test_qwen35_recurrent.py) is never kept.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.prefix_cache import PrefixStore
from flashd.daemon.runner import ModelRunner
from flashd.protocol.messages import SamplingParams
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="F32", seed=23)
CHUNK = 16
MAX_CTX = 256
N_GEN = 6


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    ops = ReferenceOps()
    return ops, load_model(write_synthetic_model(tmp_path_factory.mktemp("q35p") / "m.gguf", SPEC), ops.load_weight)


# `make` and `tokens` have the shape of test_prefix_reuse.py's on purpose: each module builds runners over its own
# model (dense there, hybrid here) with its own MAX_CTX / CHUNK, so a shared fixture would hide which ones apply.
@pytest.fixture
def make(model):
    ops, m = model

    def runner(reuse: bool = True) -> ModelRunner:
        r = ModelRunner(ops, m.config, m.weights, MAX_CTX, CHUNK)
        r.reuse_prefix = reuse
        return r

    return runner


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 500, n)]


def greedy(runner: ModelRunner, prompt) -> list[int]:
    """N_GEN greedy tokens of a request through runner.generate (start() included)."""
    return [s.token for s in runner.generate(prompt, SamplingParams(), N_GEN)]


def fresh(make, prompt):
    r = make(reuse=False)
    logits = r.start(prompt)
    return logits, r.cache.save_state(), greedy(make(reuse=False), prompt)


def assert_exact(make, runner, prompt, logits):
    want, state, _ = fresh(make, prompt)
    np.testing.assert_array_equal(logits, want)
    for got, ref in zip(runner.cache.save_state(), state):
        np.testing.assert_array_equal(got, ref)       # the recurrent state after the prompt, conv and ssm


def test_a_chat_turn_keeps_the_last_prompts_chunks_and_its_state(make):
    """old prompt (40) + its answer + a new message: the 32 tokens of the old prompt's whole chunks are kept,
    and the logits, the state and the greedy tokens are a fresh prefill's."""
    old = tokens(40, 1)
    r = make()
    answer = greedy(r, old)
    prompt = old + answer + tokens(20, 2)
    logits = r.start(prompt)
    assert r.n_reused == 32 and r.n_past == len(prompt)
    assert r.cache.prefix_state_slots == len(prompt) - len(prompt) % CHUNK
    assert_exact(make, r, prompt, logits)
    assert greedy(r, prompt) == fresh(make, prompt)[2]


def test_turns_in_a_row_keep_each_new_boundary(make):
    """Each turn keeps the last prompt's whole chunks: prompts of 20, 33, 47, 62, 78 tokens keep 0, 16, 32, 32, 48."""
    r = make()
    prompt, kept = tokens(20, 3), []
    for turn in range(4):
        answer = greedy(r, prompt)
        kept.append(r.n_reused)
        prompt = prompt + answer + tokens(7 + turn, 10 + turn)
    logits = r.start(prompt)
    kept.append(r.n_reused)
    assert kept == [0, 16, 32, 32, 48]
    assert_exact(make, r, prompt, logits)


@pytest.mark.parametrize("first,common,second", [
    (50, 40, 70),      # diverges inside the last whole chunk: the K/V of chunk 0-31 match, the state at 32 does not
    (50, 20, 70),      # diverges in the second chunk
    (48, 48, 48),      # the same prompt again: its last chunk holds the last token, which is recomputed
    (40, 3, 60),       # nothing in common
])
def test_a_prompt_that_does_not_reach_the_kept_state_prefills_from_zero(make, first, common, second):
    a = tokens(first, 4)
    b = a[:common] + tokens(second - common, 5)
    r = make()
    greedy(r, a)
    logits = r.start(b)
    assert r.n_reused == 0
    assert_exact(make, r, b, logits)


def test_a_prompt_that_ends_on_a_chunk_boundary(make):
    """The state kept at the prompt's very end (the last chunk is whole) is the state before decoding."""
    old = tokens(32, 6)
    r = make()
    answer = greedy(r, old)
    assert r.cache.prefix_state_slots == 32
    prompt = old + answer + tokens(3, 7)
    logits = r.start(prompt)
    assert r.n_reused == 32
    assert_exact(make, r, prompt, logits)


def test_writes_below_the_kept_state_drop_it(make):
    """score() prefills from slot 0 over the kept prefix: the next turn cannot keep anything."""
    old = tokens(40, 8)
    r = make()
    answer = greedy(r, old)
    r.score(tokens(10, 9))
    assert r.cache.prefix_state_slots == 0 and r.cached_prefix_tokens == 0
    prompt = old + answer + tokens(5, 10)
    logits = r.start(prompt)
    assert r.n_reused == 0
    assert_exact(make, r, prompt, logits)


def test_host_copies_keep_the_state_and_only_whole(make):
    """A side request overwrites the cache; the main conversation's prefix and its state come back from the
    host store, exactly. A copy is kept only whole: a prompt that shares part of it prefills from zero."""
    store = PrefixStore(64 << 20, CHUNK)
    r = make()
    r.prefix_store = store
    main = tokens(40, 11)
    answer = greedy(r, main)
    greedy(r, tokens(30, 12))                     # the side request: main's 32 slots go to the store first
    assert len(store) == 1 and store.n_bytes > 0
    prompt = main + answer + tokens(9, 13)
    logits = r.start(prompt)
    assert r.n_reused == 32
    assert_exact(make, r, prompt, logits)
    partial = main[:20] + tokens(30, 14)          # shares chunk 0 with the stored copy, not all of it
    logits = r.start(partial)
    assert r.n_reused == 0
    assert_exact(make, r, partial, logits)
    assert store.covers(main[:32]) and not store.covers(main[:16])
