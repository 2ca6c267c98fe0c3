"""TreeBuildOps.ddtree_build: fd_ddtree_build, the DDTree built on the device from the drafter's top-K.

A mixin of CudaOps. daemon/speculative/tree.py build_tree is the definition: from the per-depth candidates
(ids int32 / log-probs float64 (n_depth, k), as fd_topk_logprobs leaves them on the device) the kernel writes
the verify forward's input block (tree_inputs.py: ids, positions, n_past, ancestor mask) for a forward of
budget + 1 rows, and the walk's block, which `walk_tree` turns back into the DraftTree build_tree would give.
Rows the build could not fill (fewer finite candidates than the budget) are padding rows (the root's token at
position n_past, masked to themselves): the forward keeps its size, and no built node's logits change (a row
depends only on itself and its mask's rows).
"""
from __future__ import annotations

import numpy as np

from ...speculative.tree import DraftTree

__all__ = ["TreeBuildOps", "walk_words", "walk_tree", "MAX_DEPTH", "MAX_K", "MAX_NODES"]

MAX_DEPTH = 16      # ddtree.cu: 4-bit ranks in a 64-bit path
MAX_K = 16
MAX_NODES = 256     # root included


def walk_words(n_tree: int) -> int:
    """int32 words of the walk block for trees of up to n_tree nodes: [n_built | tokens | parents | depths |
    ranks], each n_tree long."""
    return 1 + 4 * n_tree


def walk_tree(block: np.ndarray, n_tree: int, scores: np.ndarray | None = None) -> DraftTree:
    """The DraftTree of a walk block read back (int32 (walk_words(n_tree),)); scores: the kernel's scores
    output if it was read back, else NaN (the walk does not read them)."""
    n = int(block[0])
    if not 1 <= n <= n_tree:
        raise RuntimeError(f"ddtree walk block: {n} nodes for a block of {n_tree}")

    def part(j: int) -> np.ndarray:
        return np.array(block[1 + j * n_tree:1 + j * n_tree + n], np.int32)
    return DraftTree(tokens=part(0), parents=part(1), depths=part(2), ranks=part(3),
                     scores=np.full(n, np.nan) if scores is None else np.array(scores[:n], np.float64))


class TreeBuildOps:
    """Mixed into CudaOps: needs self.dev, self.lib and self._check."""

    def ddtree_build(self, ids, logprobs, *, n_depth: int, budget: int, chain_seed: bool, root: int, n_past: int,
                     tree_inputs, walk, n_tree: int, scores=None) -> None:
        """fd_ddtree_build over the first n_depth rows of ids int32 / logprobs float64 (rows, k): tree_inputs
        (tree_inputs.tree_input_words(n_tree) int32) for a verify of budget + 1 rows, walk (walk_words(n_tree)
        int32), scores (n_tree float64) or None."""
        from .tree_inputs import tree_input_words
        k = ids.shape[1] if len(ids.shape) == 2 else 0
        if ids.shape != logprobs.shape or len(ids.shape) != 2 or ids.shape[0] < n_depth:
            raise ValueError(f"ddtree_build: candidates {ids.shape} / {logprobs.shape} for {n_depth} depths")
        if ids.dtype != np.int32 or logprobs.dtype != np.float64:
            raise TypeError("ddtree_build: ids int32, logprobs float64")
        if not (0 <= n_depth <= MAX_DEPTH and 1 <= k <= MAX_K and 0 <= budget < n_tree <= MAX_NODES):
            raise ValueError(f"ddtree_build: n_depth {n_depth} (<= {MAX_DEPTH}), k {k} (1..{MAX_K}), budget {budget} "
                             f"< n_tree {n_tree} (<= {MAX_NODES})")
        if tree_inputs.shape != (tree_input_words(n_tree),) or tree_inputs.dtype != np.int32:
            raise ValueError(f"ddtree_build: tree_inputs {tree_inputs.shape} {tree_inputs.dtype}, want "
                             f"({tree_input_words(n_tree)},) int32")
        if walk.shape != (walk_words(n_tree),) or walk.dtype != np.int32:
            raise ValueError(f"ddtree_build: walk {walk.shape} {walk.dtype}, want ({walk_words(n_tree)},) int32")
        if scores is not None and (scores.shape != (n_tree,) or scores.dtype != np.float64):
            raise ValueError(f"ddtree_build: scores {scores.shape} {scores.dtype}, want ({n_tree},) float64")
        if n_past < 0:
            raise ValueError(f"ddtree_build: n_past {n_past} < 0")
        dev = self.dev
        self._check(self.lib.fd_ddtree_build(
            dev.p(tree_inputs), dev.p(walk), dev.p(scores, "double*") if scores is not None else self.ffi.NULL,
            dev.p(ids), dev.p(logprobs, "double*"), n_depth, k, budget, int(bool(chain_seed)), int(root), n_past,
            n_tree, budget + 1, dev.stream), "fd_ddtree_build")
