"""Tree-aware recurrent state of the hybrid decoder (models/qwen35.py) for speculative verification.

A draft tree's verify forward (Batch.mask set: the ancestor mask, speculative/tree.py) runs the full-attention
layers with the masked tree attention, as a dense model does, and the Gated DeltaNet layers with a state per tree
node (the `_tree` ops, backends/reference_recurrent_tree.py): node i starts from its parent's state, so its output
is a one-token decode step's along its root-to-node path. The live (committed) state is not touched by the forward.

The commit (ModelRunner.commit_tree -> HybridCache.keep_tree_path) copies the last accepted node's state into the
live state -- no recomputation -- and the K/V of the accepted path move as a dense model's do; the other nodes'
states are simply dropped (the next tree forward overwrites them). Only a root-to-node path can be kept: the
recurrent state has no way to skip a token.

The parents come from the mask: node i's strict ancestors form a chain of decreasing indices (parents precede
children), so its parent is its highest-indexed strict ancestor; the mask must be exactly a tree's ancestor mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TreeStateLayer", "TreeCacheView", "tree_parents", "path_to", "MAX_TREE_NODES"]

# Nodes of one verify forward, root included, by default (ModelRunner.max_tree_nodes for a hybrid; `flashd serve
# --max-tree-nodes` sets another, and --vram-budget may lower it to fit): each node holds a whole recurrent state
# ((K - 1) C + Hv S^2 floats per linear layer, ~20 MB at the 0.8B shape, ~150 MB at the 27B one), so the node
# buffers are bounded like the GPU's masked attention (65) rather than by the prefill chunk.
MAX_TREE_NODES = 65


@dataclass(slots=True, frozen=True)
class TreeStateLayer:
    """One linear-attention layer's part of a tree forward: the live state (read only) and the node buffers."""

    conv: object          # (K - 1, C): the committed context's last conv inputs
    ssm: object           # (Hv, S, S): the committed delta-rule memory
    node_conv: object     # (n, K - 1, C): written, node i's conv window after it
    node_ssm: object      # (n, Hv, S, S): written, node i's memory after it
    parents: object       # int32 (n,): node i's parent, -1 for the root (the state's node_parents: host or device)


class TreeCacheView:
    """What a tree forward's layers see of a HybridCache: `layer(i)` is the K/V of an attention layer, a
    TreeStateLayer of a linear one (models.dense.run_layers calls it)."""

    def __init__(self, cache, parents: np.ndarray):
        self.cache, self.parents = cache, parents

    def layer(self, i: int):
        return self.cache.tree_layer(i, self.parents)


def tree_parents(mask) -> np.ndarray:
    """int32 (n,): each node's parent (-1 for a root) from a tree's ancestor mask, bool (n, n) with mask[i, j] iff
    j is i or an ancestor of i. ValueError for a mask that is not one (a recurrent state can only follow a path)."""
    mask = np.asarray(mask, bool)
    n = mask.shape[0]
    if mask.shape != (n, n) or not mask.diagonal().all() or np.triu(mask, 1).any():
        raise ValueError("a tree mask must be (n, n), include each node and no later node")
    parents = np.full(n, -1, np.int32)
    for i in range(n):
        strict = np.flatnonzero(mask[i, :i])
        if strict.size:
            parents[i] = strict[-1]
        want = mask[parents[i]].copy() if parents[i] >= 0 else np.zeros(n, bool)
        want[i] = True
        if not np.array_equal(mask[i], want):
            raise ValueError(f"mask row {i} is not its parent's ancestors plus itself: not a tree's ancestor mask")
    return parents


def path_to(parents: np.ndarray, node: int) -> list[int]:
    """Node indices from the root down to `node`, root first."""
    path = []
    while node >= 0:
        path.append(int(node))
        node = int(parents[node])
    return path[::-1]
