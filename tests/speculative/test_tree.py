"""DDTree build (daemon/speculative/tree.py) against a brute-force reference.

The reference enumerates every possible node (every rank path up to the proposal's depth), scores
it by cumulative log-prob and sorts by the documented key (-score, depth, rank path); the tree
must be exactly the first `budget` of them, in that order (after the top-1 chain when seeded).
Log-probs are drawn on a coarse grid so ties are common and the tie-break is exercised.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from flashd.daemon.speculative.drafter import Proposal
from flashd.daemon.speculative.tree import build_chain, build_tree


def random_proposal(rng, n_depth: int, k: int, with_inf: bool = False) -> Proposal:
    lp = -np.round(rng.uniform(0, 3, (n_depth, k)) * 2) / 2        # grid of 0.5: many ties, some 0
    if with_inf:
        lp[rng.random((n_depth, k)) < 0.2] = -np.inf
    tokens = rng.permutation(1000)[:n_depth * k].reshape(n_depth, k)  # distinct, unsorted by id
    return Proposal(tokens, lp)


def reference_paths(proposal: Proposal, budget: int, chain_seed: bool) -> list[tuple[int, ...]]:
    """Rank paths of the inserted nodes, in insertion order, by enumeration."""
    order = np.argsort(-proposal.logprobs, axis=1, kind="stable")
    lp = np.take_along_axis(proposal.logprobs, order, 1)
    n_depth, k = lp.shape
    nodes = []
    for depth in range(1, n_depth + 1):
        for path in itertools.product(range(k), repeat=depth):
            score = sum(lp[d, r] for d, r in enumerate(path))
            if np.all(np.isfinite([lp[d, r] for d, r in enumerate(path)])):
                nodes.append((-score, depth, path))
    nodes.sort()
    spine = []
    if chain_seed:
        for d in range(n_depth):
            if len(spine) >= budget or not np.isfinite(lp[d, 0]):
                break
            spine.append((0,) * (d + 1))
    rest = [p for _, _, p in nodes if p not in set(spine)]
    return (spine + rest)[:budget]


def tree_paths(tree) -> list[tuple[int, ...]]:
    return [tuple(int(tree.ranks[j]) for j in tree.path_to(i)[1:]) for i in range(1, tree.n_nodes)]


@pytest.mark.parametrize("chain_seed", [False, True])
@pytest.mark.parametrize("n_depth,k,budget", [(1, 1, 1), (3, 2, 5), (4, 3, 22), (5, 3, 60), (3, 4, 200), (6, 2, 0)])
def test_tree_matches_brute_force(chain_seed, n_depth, k, budget):
    rng = np.random.default_rng(1000 * n_depth + 10 * k + budget)
    for trial in range(20):
        proposal = random_proposal(rng, n_depth, k, with_inf=trial % 3 == 2)
        tree = build_tree(7, proposal, budget, chain_seed=chain_seed)
        assert tree_paths(tree) == reference_paths(proposal, budget, chain_seed)
        # tokens, depths and scores follow from the paths
        order = np.argsort(-proposal.logprobs, axis=1, kind="stable")
        toks = np.take_along_axis(proposal.tokens, order, 1)
        lps = np.take_along_axis(proposal.logprobs, order, 1)
        assert tree.tokens[0] == 7 and tree.parents[0] == -1 and tree.depths[0] == 0
        for i, path in enumerate(tree_paths(tree), start=1):
            assert tree.depths[i] == len(path)
            assert tree.tokens[i] == toks[len(path) - 1, path[-1]]
            assert tree.scores[i] == pytest.approx(sum(lps[d, r] for d, r in enumerate(path)))
            assert tree.parents[i] < i


def test_max_depth_limits_the_tree():
    rng = np.random.default_rng(5)
    proposal = random_proposal(rng, 6, 3)
    tree = build_tree(0, proposal, 100, max_depth=2)
    assert tree.depths.max() == 2 and tree.n_nodes == 1 + 3 + 9


def test_chain_is_the_top1_path():
    proposal = Proposal(np.array([[5, 6], [7, 8], [9, 10]]), np.array([[-1.0, -0.5], [-0.1, -2], [-np.inf, -1]]))
    chain = build_chain(1, proposal, 10)
    # row 0 sorted by log-prob puts 6 first; row 2's best finite candidate is rank 0 after sorting (10)
    assert chain.tokens.tolist() == [1, 6, 7, 10]
    assert chain.parents.tolist() == [-1, 0, 1, 2]
    assert build_chain(1, proposal, 2).tokens.tolist() == [1, 6, 7]
    assert build_chain(1, Proposal.empty(), 5).n_nodes == 1


def test_ancestor_mask_and_positions():
    rng = np.random.default_rng(9)
    tree = build_tree(3, random_proposal(rng, 4, 3), 15)
    mask = tree.ancestor_mask()
    for i in range(tree.n_nodes):
        want = np.zeros(tree.n_nodes, bool)
        want[tree.path_to(i)] = True
        assert np.array_equal(mask[i], want)
    assert np.array_equal(tree.positions(100), 100 + tree.depths)


def test_negative_budget_is_refused():
    with pytest.raises(ValueError):
        build_tree(0, Proposal.empty(), -1)
