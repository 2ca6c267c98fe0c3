"""Tree-aware recurrent state (backends/reference_recurrent_tree.py, models/qwen35_tree.py), against running each
root-to-node path one token at a time:

- the tree ops: every node's output row and its conv / delta-rule state are bit for bit (np.array_equal) what
  the recurrent form's one-token steps along its root-to-node path give, from the same committed state and the
  same input rows, on awkward trees (one node, a deep chain, a wide fan, random trees, a forest of roots); the
  committed state is not written. The same comparison fails when nodes start from the committed state instead
  of their parent's (the check can fail);
- tree_parents: a DraftTree's parents from its ancestor mask; masks that are not a tree's are refused.

Tolerance: none. The tree ops call the decode step's own functions on one row from a copy of the parent's state.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.reference_recurrent import causal_conv1d, delta_rule_recurrent
from flashd.daemon.backends.reference_recurrent_tree import causal_conv1d_tree, check_parents, delta_rule_tree
from flashd.daemon.models.qwen35_tree import path_to, tree_parents
from flashd.daemon.speculative.drafter import Proposal
from flashd.daemon.speculative.tree import build_tree

C, K = 24, 4                   # conv channels, taps
HK, HV, S = 2, 4, 8            # key heads, value heads, head size


def random_parents(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], np.int32)


TREES = {
    "single": np.array([-1], np.int32),
    "chain": np.arange(-1, 15, dtype=np.int32),                       # 16 deep
    "fan": np.array([-1] + [0] * 12, np.int32),                      # root + 12 children
    "fan-of-chains": np.array([-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7], np.int32),
    "random": random_parents(30, 3),
    "forest": np.array([-1, -1, 0, 1, -1, 2, 5], np.int32),          # three roots on the committed state
}


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def delta_inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)

    def l2(x):
        return (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)

    q, k, v = l2(f32(rng, n, HK, S)), l2(f32(rng, n, HK, S)), f32(rng, n, HV, S)
    g = (-np.log1p(np.exp(rng.standard_normal((n, HV)))) * rng.uniform(0.01, 1.0, HV)).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((n, HV))))).astype(np.float32)
    return q, k, v, g, beta, f32(rng, HV, S, S, scale=0.3)


def sequential_delta(inputs, state, path):
    """(output rows, memory) of one-token recurrent steps over `path`'s rows from a copy of `state`."""
    q, k, v, g, beta = inputs
    memory, rows = state.copy(), []
    for i in path:
        rows.append(delta_rule_recurrent(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1], memory)[0])
    return rows, memory


def sequential_conv(x, weight, conv_state, path):
    window, rows = conv_state.copy(), []
    for i in path:
        rows.append(causal_conv1d(x[i:i + 1], weight, window)[0])
    return rows, window


def tree_delta(inputs, state, parents):
    node_state = np.full((len(parents), HV, S, S), np.nan, np.float32)
    committed = state.copy()
    out = delta_rule_tree(*inputs, committed, parents, node_state)
    np.testing.assert_array_equal(committed, state)                  # read only
    return out, node_state


def tree_conv(x, weight, conv_state, parents):
    node_conv = np.full((len(parents), K - 1, C), np.nan, np.float32)
    committed = conv_state.copy()
    out = causal_conv1d_tree(x, weight, committed, parents, node_conv)
    np.testing.assert_array_equal(committed, conv_state)
    return out, node_conv


@pytest.mark.parametrize("name", sorted(TREES))
def test_delta_rule_nodes_are_decode_steps_along_their_paths(name):
    parents = TREES[name]
    *inputs, state = delta_inputs(len(parents), seed=len(parents))
    out, node_state = tree_delta(inputs, state, parents)
    for i in range(len(parents)):
        rows, memory = sequential_delta(inputs, state, path_to(parents, i))
        assert np.array_equal(out[i], rows[-1]), f"node {i}: output"
        assert np.array_equal(node_state[i], memory), f"node {i}: state"


@pytest.mark.parametrize("name", sorted(TREES))
def test_conv_nodes_are_decode_steps_along_their_paths(name):
    parents = TREES[name]
    rng = np.random.default_rng(len(parents) + 1)
    x, weight, conv_state = f32(rng, len(parents), C), f32(rng, C, K), f32(rng, K - 1, C)
    out, node_conv = tree_conv(x, weight, conv_state, parents)
    for i in range(len(parents)):
        path = path_to(parents, i)
        rows, window = sequential_conv(x, weight, conv_state, path)
        assert np.array_equal(out[i], rows[-1]), f"node {i}: output"
        assert np.array_equal(node_conv[i], window), f"node {i}: window"
        # the window is the path's last K - 1 inputs after the committed ones
        np.testing.assert_array_equal(window, np.concatenate([conv_state, x[path]])[-(K - 1):])


def test_the_path_check_fails_when_nodes_ignore_their_parents_state():
    """Nodes computed from the committed state (parents all -1) match the sequential paths only at depth 1: the
    comparison above would catch a tree op that does not start from the parent's state."""
    parents = TREES["fan-of-chains"]
    *inputs, state = delta_inputs(len(parents), seed=5)
    rng = np.random.default_rng(6)
    x, weight, conv_state = f32(rng, len(parents), C), f32(rng, C, K), f32(rng, K - 1, C)
    flat = np.full_like(parents, -1)
    out, node_state = tree_delta(inputs, state, flat)
    y, node_conv = tree_conv(x, weight, conv_state, flat)
    for i in range(len(parents)):
        path = path_to(parents, i)
        rows, memory = sequential_delta(inputs, state, path)
        conv_rows, window = sequential_conv(x, weight, conv_state, path)
        same = (np.array_equal(out[i], rows[-1]) and np.array_equal(node_state[i], memory)
                and np.array_equal(y[i], conv_rows[-1]) and np.array_equal(node_conv[i], window))
        assert same == (len(path) == 1), f"node {i} at depth {len(path) - 1}"


def test_bad_parents_are_refused():
    for bad in ([0], [-1, 1], [-1, 0, 3], [-2, 0]):
        with pytest.raises(ValueError):
            check_parents(np.array(bad), len(bad))


def test_tree_parents_recovers_a_draft_tree():
    rng = np.random.default_rng(11)
    lp = -np.sort(rng.uniform(0, 3, (6, 4)), axis=1)
    tree = build_tree(7, Proposal(rng.integers(0, 100, (6, 4)).astype(np.int32), lp), 18)
    np.testing.assert_array_equal(tree_parents(tree.ancestor_mask()), tree.parents)
    np.testing.assert_array_equal(tree_parents(np.tril(np.ones((5, 5), bool))), np.arange(-1, 4))   # a chain


def test_a_forest_mask_gives_several_roots():
    np.testing.assert_array_equal(tree_parents(np.array([[1, 0, 0], [0, 1, 0], [0, 1, 1]], bool)), [-1, -1, 1])


@pytest.mark.parametrize("rows", [
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]],          # node 2 sees 1 but not 1's ancestor 0
    [[1, 1, 0], [0, 1, 0], [0, 0, 1]],          # a later node
    [[1, 0, 0], [1, 0, 0], [0, 0, 1]],          # not itself
    [[1, 0, 0], [1, 1, 0]],                     # not square
])
def test_tree_parents_refuses_masks_that_are_not_a_trees(rows):
    with pytest.raises(ValueError):
        tree_parents(np.array(rows, bool))
