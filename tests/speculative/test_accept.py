"""Acceptance walks (daemon/speculative/accept.py) against brute-force references."""
from __future__ import annotations

import math

import numpy as np
import pytest

from flashd.daemon.speculative.accept import greedy_walk, sample_walk
from flashd.daemon.speculative.drafter import Proposal
from flashd.daemon.speculative.tree import build_tree

from tests.speculative.chi_square import chi_square_p_value


def random_tree(rng, vocab: int, n_depth: int, k: int, budget: int):
    tokens = np.stack([rng.choice(vocab, k, replace=False) for _ in range(n_depth)])
    lp = -rng.uniform(0, 2, (n_depth, k))
    return build_tree(int(rng.integers(vocab)), Proposal(tokens, lp), budget)


def brute_force_greedy(tree, target: np.ndarray) -> tuple[list[int], int]:
    """A node is accepted iff every edge of its path carries the target's token at the edge's
    parent; the deepest accepted node (first inserted among equals) ends the path."""
    best = 0
    for i in range(1, tree.n_nodes):
        path = tree.path_to(i)
        if all(tree.tokens[c] == target[p] for p, c in zip(path, path[1:])):
            if tree.depths[i] > tree.depths[best]:
                best = i
    return tree.path_to(best), int(target[best])


def test_greedy_walk_matches_brute_force():
    rng = np.random.default_rng(11)
    vocab = 4                       # tiny vocabulary: the target often agrees with a draft
    for _ in range(500):
        tree = random_tree(rng, vocab, int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 30)))
        target = rng.integers(0, vocab, tree.n_nodes)
        assert greedy_walk(tree, lambda i: target[i]) == brute_force_greedy(tree, target)


def test_greedy_walk_only_asks_along_the_path():
    rng = np.random.default_rng(3)
    tree = random_tree(rng, 3, 4, 3, 40)
    target = rng.integers(0, 3, tree.n_nodes)
    asked = []
    path, _ = greedy_walk(tree, lambda i: (asked.append(i), target[i])[1])
    assert asked == path


@pytest.mark.parametrize("case", ["draft-is-likely", "draft-is-unlikely", "draft-has-zero-prob", "no-children"])
def test_sample_walk_first_token_has_the_target_distribution(case):
    """One node's output: for a point-mass draft set the emitted token must be distributed as p,
    whatever the children are. 20000 draws from a fixed-seed generator, chi-square at alpha 1e-3."""
    ids = np.array([2, 5, 7, 9])
    p = np.array([0.5, 0.3, 0.15, 0.05])
    children = {"draft-is-likely": [[2, 5, 7]], "draft-is-unlikely": [[9, 7]],
                "draft-has-zero-prob": [[3, 9]], "no-children": []}[case]
    tokens = np.array(children, np.int32).reshape(-1, len(children[0]) if children else 1)
    proposal = Proposal(tokens, np.zeros(tokens.shape)) if children else Proposal.empty()
    tree = build_tree(0, proposal, 10, chain_seed=False)
    gen = np.random.default_rng(2024)
    counts = {int(t): 0 for t in ids}
    n = 20000
    for _ in range(n):
        path, bonus = sample_walk(tree, lambda i: (ids, p) if i == 0 else (ids, np.full(4, 0.25)),
                                  lambda: float(gen.random()))
        first = int(tree.tokens[path[1]]) if len(path) > 1 else bonus
        counts[first] += 1
    observed = np.array([counts[int(t)] for t in ids])
    assert chi_square_p_value(observed, n * p) > 1e-3, observed


def test_sample_walk_rejects_zero_probability_drafts_without_a_draw():
    tree = build_tree(0, Proposal(np.array([[3]]), np.zeros((1, 1))), 1)
    draws = []
    path, bonus = sample_walk(tree, lambda i: (np.array([1, 2]), np.array([0.5, 0.5])),
                              lambda: (draws.append(1), 0.7)[1])
    assert path == [0] and bonus == 2 and len(draws) == 1          # only the bonus draw


def test_chi_square_p_value_reference_points():
    # chi-square survival function at known points (tables): df 1 at 3.841 -> 0.05, df 4 at 13.277 -> 0.01
    assert chi_square_p_value(None, None, statistic=3.841, df=1) == pytest.approx(0.05, abs=2e-4)
    assert chi_square_p_value(None, None, statistic=13.277, df=4) == pytest.approx(0.01, abs=2e-5)
    assert chi_square_p_value(None, None, statistic=0.0, df=3) == pytest.approx(1.0)
    assert math.isclose(chi_square_p_value(None, None, statistic=40.0, df=10), 1.7e-5, rel_tol=0.05)
