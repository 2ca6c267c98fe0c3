"""Numpy oracles of a hybrid model's recurrent layers over a draft tree (speculative verification, qwen35): the
causal conv1d and the gated delta rule with a state per tree node, derived from its parent's.

A draft tree of n nodes is verified in one target forward. An attention layer reads each node's ancestors through
the ancestor mask; a recurrent layer has no such mask -- its state is a summary of everything before -- so each node
needs the state after its own root-to-node path. Both functions make them in one pass over the nodes in
topological order (parents[i] < i, as speculative/tree.py builds them; the root's parent is -1: the committed
state):

    node i's conv window   = the last K - 1 inputs of its parent's path (its parent's conv state) + x_i
    node i's delta state   = its parent's state updated by node i's token (one recurrent step)

Each node runs the recurrent (decode) form's own functions on its one row (reference_recurrent.py:
causal_conv1d on (1, C), delta_rule_recurrent on (1, H, S)) starting from a copy of its parent's state, so its
output and its state are bit for bit those of one-token decode steps along its root-to-node path
(tests/reference/test_qwen35_tree_state.py). The committed state is read, never written: the rejected nodes need no
rollback, and the commit copies the accepted node's state in (ReferenceRecurrentState.keep_node).

Shapes: n nodes; C conv channels, K taps; Hk / Hv key / value heads, S the head size.
Memory: the node states are n copies of the layer's state, (n, K - 1, C) + (n, Hv, S, S) float32 per layer.
"""
from __future__ import annotations

import numpy as np

from .reference_recurrent import causal_conv1d, delta_rule_recurrent

__all__ = ["causal_conv1d_tree", "delta_rule_tree", "check_parents"]


def check_parents(parents, n: int) -> np.ndarray:
    """parents as int64 (n,), or ValueError unless every parent precedes its node (-1: the committed context)."""
    parents = np.asarray(parents, np.int64)
    if parents.shape != (n,):
        raise ValueError(f"tree parents: expected shape ({n},), got {parents.shape}")
    if np.any(parents < -1) or np.any(parents >= np.arange(n)):
        raise ValueError(f"tree parents {parents.tolist()}: each node's parent must come before it (or be -1)")
    return parents


def _parent_state(committed: np.ndarray, node_states: np.ndarray, parent: int) -> np.ndarray:
    """A fresh copy of the state the node starts from: its parent's, or the committed one for a root."""
    return (committed if parent < 0 else node_states[parent]).copy()


def causal_conv1d_tree(x, weight, conv_state, parents, node_conv) -> np.ndarray:
    """x (n, C) the nodes' conv inputs, weight (C, K), conv_state (K - 1, C) the committed context's last inputs
    (read only), parents (n,). Writes node_conv (>= n, K - 1, C): node i's conv state (its path's last K - 1
    inputs). Returns y (n, C), row i = the one-token causal_conv1d of x_i after its parent's window."""
    n = x.shape[0]
    parents = check_parents(parents, n)
    y = np.empty_like(x)
    for i in range(n):
        window = _parent_state(conv_state, node_conv, int(parents[i]))
        y[i] = causal_conv1d(np.ascontiguousarray(x[i:i + 1]), weight, window)[0]
        node_conv[i] = window
    return y


def delta_rule_tree(q, k, v, g, beta, state, parents, node_state) -> np.ndarray:
    """q, k (n, Hk, S) L2-normed, v (n, Hv, S), g, beta (n, Hv); state (Hv, S, S) the committed memory (read only),
    parents (n,). Writes node_state (>= n, Hv, S, S): the memory after node i's path. Returns o (n, Hv, S), row i =
    delta_rule_recurrent of node i's row from its parent's memory."""
    n = v.shape[0]
    parents = check_parents(parents, n)
    out = np.empty_like(v)
    for i in range(n):
        memory = _parent_state(state, node_state, int(parents[i]))
        row = slice(i, i + 1)
        out[i] = delta_rule_recurrent(*(np.ascontiguousarray(a[row]) for a in (q, k, v, g, beta)), memory)[0]
        node_state[i] = memory
    return out
