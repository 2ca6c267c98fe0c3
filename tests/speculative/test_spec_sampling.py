"""Sampled speculative decoding has the target's output distribution (tree rejection sampling).

Oracle: the exact joint distribution of the first three generated tokens, computed by enumerating
every kept token at each position through the target (teacher forcing) and the same pipeline as
plain sampling (penalties over the history, temperature, top_k; sampling.py). top_k = 3 keeps the
joint to at most 27 cells. Each drafter/mode runs N_RUNS generations with seeds 0..N_RUNS-1 (fixed,
so the test is deterministic) and Pearson's chi-square test must not reject at ALPHA = 1e-3.
A negative control (plain sampling at a different temperature, same N) must be rejected, which
shows the test has the power to see a wrong distribution of this size.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.sampling import apply_penalties, candidate_probs
from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
from flashd.daemon.speculative.draft_model import DraftModelDrafter
from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter
from flashd.protocol.messages import SamplingParams

from tests.speculative.chi_square import chi_square_p_value
from tests.speculative.spec_models import DRAFT, TARGET

ALPHA = 1e-3
N_RUNS = 1500
N_TOKENS = 3
PROMPT = [5, 9, 77, 12, 5, 9, 77, 12, 5, 9]
PARAMS = SamplingParams(temperature=1.5, top_k=3, repeat_penalty=1.2, repeat_last_n=8)


def exact_joint(runner, prompt, params) -> dict[tuple[int, ...], float]:
    """P(first N_TOKENS tokens) under plain sampling, by enumeration."""
    out: dict[tuple[int, ...], float] = {}

    def dist(prefix):
        logits = runner.score(prompt + list(prefix))[-1]
        ids, probs = candidate_probs(apply_penalties(logits, np.asarray(prompt + list(prefix)), params), params)
        return ids, probs

    def walk(prefix, p):
        if len(prefix) == N_TOKENS:
            out[tuple(prefix)] = p
            return
        ids, probs = dist(prefix)
        for t, q in zip(ids, probs):
            walk(prefix + [int(t)], p * q)

    walk([], 1.0)
    return out


def counts_of(samples, cells):
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    for s in samples:
        counts[index.get(tuple(s), len(cells))] += 1        # last cell: impossible outcomes
    return counts


@pytest.fixture(scope="module")
def target(make_runner):
    return make_runner(TARGET)


@pytest.fixture(scope="module")
def joint(target):
    j = exact_joint(target, PROMPT, PARAMS)
    assert abs(sum(j.values()) - 1) < 1e-9
    return j


@pytest.fixture(scope="module")
def ngram_prompt(target):
    """A prompt that repeats its start followed by the target's own greedy continuation of it,
    so the n-gram drafter proposes likely tokens (and sometimes gets them accepted)."""
    base = [5, 9, 77]
    cont = [s.token for s in target.generate(base, SamplingParams(), 6)]
    return base + cont + base


@pytest.mark.parametrize("kind,mode,budget", [("draft-model", "chain", 2), ("draft-model", "ddtree", 6),
                                              ("ngram", "ddtree", 4)])
def test_sampled_spec_has_the_target_distribution(make_runner, target, joint, ngram_prompt, kind, mode, budget):
    prompt = PROMPT if kind == "draft-model" else ngram_prompt
    if kind == "ngram":
        joint = exact_joint(target, prompt, PARAMS)
    drafter = (DraftModelDrafter(make_runner(DRAFT), "draft") if kind == "draft-model"
               else NgramDrafter(NgramConfig(min_ngram=1)))
    dec = SpecDecoder(target, drafter, SpecConfig(mode, budget))
    samples, accepted, rejected_steps = [], 0, 0
    for seed in range(N_RUNS):
        params = SamplingParams(**{**{f: getattr(PARAMS, f) for f in PARAMS.__slots__}, "seed": seed})
        samples.append([s.token for s in dec.generate(prompt, params, N_TOKENS)])
        accepted += dec.stats.accepted
        rejected_steps += dec.stats.histogram[0]
    # the test only means something if drafts were both accepted and rejected
    print(f"{kind} {mode} {budget}: accepted {accepted}, steps with nothing accepted {rejected_steps}")
    assert accepted > N_RUNS // 20 and rejected_steps > N_RUNS // 20, (accepted, rejected_steps)
    cells = sorted(joint)
    observed = counts_of(samples, cells)
    expected = np.array([joint[c] for c in cells] + [0.0]) * N_RUNS
    p = chi_square_p_value(observed, expected)
    assert p > ALPHA, f"chi-square p = {p:.2e}; observed {observed.tolist()} expected {np.round(expected, 1).tolist()}"


def test_the_test_rejects_a_wrong_distribution(target, joint):
    """Negative control: plain sampling at temperature 1.0 instead of 1.5 is a different
    distribution of the size a wrong verifier produces; the same test must reject it."""
    wrong = SamplingParams(temperature=1.0, top_k=3, repeat_penalty=1.2, repeat_last_n=8)
    samples = []
    for seed in range(N_RUNS):
        params = SamplingParams(**{**{f: getattr(wrong, f) for f in wrong.__slots__}, "seed": seed})
        samples.append([s.token for s in target.generate(PROMPT, params, N_TOKENS)])
    cells = sorted(joint)
    observed = counts_of(samples, cells)
    expected = np.array([joint[c] for c in cells] + [0.0]) * N_RUNS
    assert chi_square_p_value(observed, expected) < ALPHA


def test_plain_sampling_passes_the_same_test(target, joint):
    """Positive control: plain sampling (the definition) passes with these seeds."""
    samples = [[s.token for s in target.generate(PROMPT, SamplingParams(
        **{**{f: getattr(PARAMS, f) for f in PARAMS.__slots__}, "seed": seed}), N_TOKENS)] for seed in range(N_RUNS)]
    cells = sorted(joint)
    expected = np.array([joint[c] for c in cells] + [0.0]) * N_RUNS
    assert chi_square_p_value(counts_of(samples, cells), expected) > ALPHA
