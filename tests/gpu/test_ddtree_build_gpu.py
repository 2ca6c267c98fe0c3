"""fd_ddtree_build (CudaOps.ddtree_build, tree_build.py) against its definition, daemon/speculative/tree.py
build_tree, on the same candidates.

Exact: the kernel inserts the same nodes in the same order (tokens, parents, depths, ranks equal) and sums the
same float64 log-probs in the same order, so the scores are equal bit for bit; the verify's input block equals
pack_tree_inputs of build_tree's tree (ids, positions, n_past, ancestor mask). Candidates are awkward on
purpose: unsorted rows, ties (equal log-probs: the stable sort's and the key's tie-breaks), -inf and NaN
entries, shallow proposals that cannot fill the budget (padding rows), k and depth at their limits. Outputs
are poisoned first, so a word the kernel forgot to write fails.
"""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.tree_build import MAX_NODES, walk_tree, walk_words
from flashd.daemon.backends.cuda.tree_inputs import pack_tree_inputs, tree_input_words
from flashd.daemon.speculative.drafter import Proposal
from flashd.daemon.speculative.tree import build_tree


@pytest.fixture(scope="module")
def ops(dev):
    from flashd.daemon.backends.cuda.ops import CudaOps

    return CudaOps(dev)


def proposal(rng, n_depth: int, k: int, kind: str) -> Proposal:
    ids = rng.integers(0, 151936, (n_depth, k)).astype(np.int32)
    lp = -rng.exponential(2.0, (n_depth, k))
    if kind == "sorted":                  # fd_topk_logprobs' rows: best first
        lp = -np.sort(-lp, axis=1)
    elif kind == "ties":                  # few distinct values: every tie-break matters
        lp = -np.round(rng.exponential(1.0, (n_depth, k)) * 2) / 2
    elif kind == "nonfinite":
        lp[rng.random((n_depth, k)) < 0.2] = -np.inf
        lp[rng.random((n_depth, k)) < 0.05] = np.nan
        if n_depth > 2:
            lp[2, :] = -np.inf            # a depth with nothing usable: the tree stops above it
    return Proposal(ids, lp)


def run_kernel(ops, poisoned, prop: Proposal, budget: int, chain_seed: bool, root: int, n_past: int, n_tree: int):
    n_depth, k = prop.tokens.shape if prop.tokens.size else (0, 1)
    dev = ops.dev
    ids = dev.upload(prop.tokens if prop.tokens.size else np.zeros((1, k), np.int32))
    lp = dev.upload(prop.logprobs.astype(np.float64) if prop.tokens.size else np.zeros((1, k)))
    inputs = poisoned((tree_input_words(n_tree),), np.int32)
    walk = poisoned((walk_words(n_tree),), np.int32)
    scores = dev.empty((n_tree,), np.float64)
    ops.ddtree_build(ids, lp, n_depth=n_depth, budget=budget, chain_seed=chain_seed, root=root, n_past=n_past,
                     tree_inputs=inputs, walk=walk, n_tree=n_tree, scores=scores)
    return dev.download(inputs), dev.download(walk), dev.download(scores)


CASES = [(15, 8, 22, "sorted"), (15, 8, 32, "sorted"), (15, 8, 64, "random"), (16, 16, 255, "random"),
         (7, 3, 40, "ties"), (15, 8, 22, "ties"), (15, 8, 100, "nonfinite"), (4, 2, 30, "random"),
         (1, 1, 5, "sorted"), (15, 1, 15, "sorted"), (0, 8, 6, "sorted"), (12, 5, 0, "random"), (15, 8, 1, "ties")]


@pytest.mark.parametrize("n_depth,k,budget,kind", CASES)
@pytest.mark.parametrize("chain_seed", [True, False])
def test_kernel_builds_build_trees_tree(ops, rng, poisoned, n_depth, k, budget, kind, chain_seed):
    prop = proposal(rng, n_depth, k, kind) if n_depth else Proposal(np.zeros((0, k), np.int32), np.zeros((0, k)))
    root, n_past, n_tree = 4242, 1000 + int(rng.integers(0, 5000)), min(MAX_NODES, budget + 1 + 7)
    inputs, walk, scores = run_kernel(ops, poisoned, prop, budget, chain_seed, root, n_past, n_tree)
    want = build_tree(root, prop, budget, chain_seed=chain_seed)
    got = walk_tree(walk, n_tree, scores)
    for field in ("tokens", "parents", "depths", "ranks"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    assert got.scores.tobytes() == want.scores.tobytes()          # the same sums, bit for bit
    n, m = want.n_nodes, budget + 1
    if n == m:                              # the budget filled: exactly the host's verify block
        ref = pack_tree_inputs(want.tokens, want.positions(n_past), want.ancestor_mask(), n_past, n_tree)
        words = 2 * n_tree + 1 + -(-m * m // 4)
        np.testing.assert_array_equal(inputs[:m], ref[:m])
        np.testing.assert_array_equal(inputs[n_tree:n_tree + m], ref[n_tree:n_tree + m])
        assert inputs[2 * n_tree] == n_past
        assert inputs[2 * n_tree + 1:words].view(np.uint8)[:m * m].tobytes() == \
            ref[2 * n_tree + 1:words].view(np.uint8)[:m * m].tobytes()
    else:                                   # the rest are padding rows: the root at n_past, masked to itself
        assert n < m
        mask = inputs[2 * n_tree + 1:].view(np.uint8)[:m * m].reshape(m, m)
        np.testing.assert_array_equal(mask[:n, :n], want.ancestor_mask())
        assert not mask[:n, n:].any()
        np.testing.assert_array_equal(mask[n:], np.eye(m, dtype=np.uint8)[n:])
        np.testing.assert_array_equal(inputs[:m], np.concatenate([want.tokens, np.full(m - n, root, np.int32)]))
        np.testing.assert_array_equal(inputs[n_tree:n_tree + m],
                                      np.concatenate([want.positions(n_past), np.full(m - n, n_past, np.int32)]))


def test_many_random_proposals(ops, rng, poisoned):
    """300 proposals of random shape and kind, budgets up to the kernel's limit."""
    for _ in range(300):
        n_depth, k = int(rng.integers(1, 17)), int(rng.integers(1, 17))
        budget = int(rng.integers(0, min(MAX_NODES - 1, n_depth * k + 3) + 1))
        kind = ["sorted", "random", "ties", "nonfinite"][int(rng.integers(0, 4))]
        chain_seed = bool(rng.integers(0, 2))
        prop = proposal(rng, n_depth, k, kind)
        n_tree = min(MAX_NODES, budget + 1 + int(rng.integers(0, 4)))
        _, walk, scores = run_kernel(ops, poisoned, prop, budget, chain_seed, 7, 3, n_tree)
        want = build_tree(7, prop, budget, chain_seed=chain_seed)
        got = walk_tree(walk, n_tree, scores)
        for field in ("tokens", "parents", "depths", "ranks"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field),
                                          err_msg=f"{field}: depth {n_depth} k {k} budget {budget} {kind}")
        assert got.scores.tobytes() == want.scores.tobytes()


@pytest.mark.parametrize("bad", [dict(n_depth=17), dict(budget=8, n_tree=8), dict(n_past=-1)])
def test_bad_arguments_are_refused_before_the_call(ops, bad):
    dev = ops.dev
    k = 4
    args = dict(n_depth=3, budget=5, n_tree=16, n_past=0)
    args.update(bad)
    rows = max(args["n_depth"], 1)
    ids, lp = dev.empty((rows, k), np.int32), dev.empty((rows, k), np.float64)
    inputs, walk = dev.empty((tree_input_words(args["n_tree"]),), np.int32), dev.empty((walk_words(args["n_tree"]),),
                                                                                        np.int32)
    with pytest.raises(ValueError):
        ops.ddtree_build(ids, lp, chain_seed=True, root=1, tree_inputs=inputs, walk=walk, **args)
