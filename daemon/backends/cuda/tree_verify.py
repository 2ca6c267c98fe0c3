"""DeviceTreeVerify: CudaRunner's verify of a draft tree built on the device (tree_build.py, fd_ddtree_build).

A speculative step whose drafter leaves its per-depth top-K on the device (speculative/drafter.py,
DeviceProposal) runs without a host round trip before the verify: the tree is built by one kernel straight into
the verify forward's input block (the block forward_tree would upload), the forward of budget + 1 rows replays
the same captured graph as forward_tree's, and the argmax of every row lands beside the tree's walk block, so
one read-back brings both: the DraftTree (the nodes build_tree would give, in its order) and the target's choice
at each node. Rows the build could not fill are padding (tree_build.py), never part of the walk.

Where it does not apply (a hybrid target: its verify keeps a recurrent state per node from the host's tree; a
runner sized for trees beyond the kernel's MAX_NODES; candidates deeper or wider than MAX_DEPTH / MAX_K) the
decoder keeps the host build (`device_tree_fits`).
"""
from __future__ import annotations

import numpy as np

from ...sampling import NonFiniteLogits
from ...speculative.tree import DraftTree
from .tree_build import MAX_DEPTH, MAX_K, MAX_NODES, walk_tree, walk_words

__all__ = ["DeviceTreeVerify"]


class DeviceTreeVerify:
    """Mixed into CudaRunner: needs ops, dev, n_past, max_tree_nodes, _tree_slots, _t_inputs, _will_write,
    tree_features and _tree_graph."""

    device_tree = True          # CudaHybridRunner: False

    def device_tree_fits(self, n_depth: int, k: int, budget: int) -> bool:
        """Whether a tree of `budget` drafted nodes from (n_depth, k) candidates can be built and verified here."""
        return (self.device_tree and 1 <= n_depth <= MAX_DEPTH and 1 <= k <= MAX_K and 1 <= budget
                and budget + 1 <= self.max_tree_nodes and self._tree_slots <= MAX_NODES)

    def forward_tree_device(self, proposal, *, n_depth: int, budget: int, chain_seed: bool, root: int,
                            capture=()):
        """The tree of `budget` drafted nodes from the device proposal's first n_depth depths, built on the device
        and verified in one forward of budget + 1 rows (forward_tree's graph; `capture` as there). Returns the
        logits (budget + 1, vocab) on the device; walk_device reads the tree and the argmax back."""
        n = budget + 1
        if not self.device_tree_fits(n_depth, proposal.k, budget):
            raise ValueError(f"a device tree of {budget} nodes from {n_depth} x {proposal.k} candidates does not fit "
                             f"this runner (max_tree_nodes {self.max_tree_nodes})")
        capture = tuple(int(i) for i in capture)
        if capture:
            self.tree_features(capture)             # allocated outside any capture
        self._will_write(n)
        walk = self._walk_block()
        self.ops.ddtree_build(proposal.ids, proposal.logprobs, n_depth=n_depth, budget=budget, chain_seed=chain_seed,
                              root=root, n_past=self.n_past, tree_inputs=self._t_inputs,
                              walk=walk[:walk_words(self._tree_slots)], n_tree=self._tree_slots)
        graph, logits = self._tree_graph(n, capture)
        self.dev.native.check(self.dev.lib.fd_graph_launch(graph, self.dev.stream), "graph launch")
        return logits

    def walk_device(self, logits) -> tuple[DraftTree, np.ndarray]:
        """After forward_tree_device: (the tree built, int32 argmax of every forward row), in one read-back."""
        n, words = logits.shape[0], walk_words(self._tree_slots)
        walk = self._walk_block()
        self.ops.argmax(logits, walk[words:words + n])
        host = self.dev.download(walk[:words + n])
        argmax = host[words:]
        if (argmax < 0).any():                  # fd_argmax: -1 for a row of NaNs
            raise NonFiniteLogits(f"in verify row {int(np.flatnonzero(argmax < 0)[0])}")
        return walk_tree(host[:words], self._tree_slots), argmax

    def _walk_block(self):
        """[walk block (walk_words(n_tree)) | argmax (n_tree)] int32, allocated on first use."""
        block = getattr(self, "_t_walk", None)
        if block is None:
            block = self._t_walk = self.dev.empty((walk_words(self._tree_slots) + self._tree_slots,), np.int32)
        return block
