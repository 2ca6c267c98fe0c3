"""CudaHybridRunner: a hybrid (qwen35) model on the GPU. Decode steps replay CudaRunner's captured decode graph;
prefill, scoring and draft-tree verification run the model's forward eagerly.

The decode step is CudaRunner's own machinery (_decode_body, _graph, _capture; generate and greedy_continue replay
the graph with PIPELINE_DEPTH steps in flight): only the step's forward differs, models.qwen35.forward with
new_sequence=False (`_step_forward`). Everything it launches is device-side with static addresses -- the ops of
hybrid_ops.py (ABI 13: no host step), the conv and delta-rule kernels on the device state (recurrent_state.py), the
arena -- and the per-step scalars (tok, pos, n_past) are CudaRunner's device words. What the eager forward decides
on the host, the runner does before it replays: the forward reads n_past back to clear the state of a sequence
that starts at slot 0 (greedy_continue from an empty context clears it here; generate's prompt is prefilled
eagerly, which clears it), and it marks the tree node states stale (end_tree, called here). The fused kernels
(fused_ops.py) read no constant outside the arena; the composition that heads over 128 run reads one (l2_norm's
weight), made before every capture (HybridOps.prepare_capture), so a capture after ops.release() (parking) uploads
nothing. No persistent forward: it has no Gated DeltaNet stage.

Draft trees are verified eagerly (forward_tree: CudaRunner's verify body, row invariant, without a graph -- the
forward reads the tree's parents off the mask on the host and uploads them; commit_tree: the recurrent state of
the accepted path's last node, then the K/V move): the linear layers run the causal_conv1d_silu_tree /
gated_delta_rule_fused_tree kernels from a state per node (recurrent_state.py), whose outputs are bitwise decode
steps (causal_conv1d_silu / gated_delta_rule_fused) along each node's path, and the decode graph launches the same kernels as an eager one-row forward, so
speculative decoding gives this runner's plain greedy tokens.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ...models.qwen35 import forward as qwen35_forward
from ..base import Batch
from .ops import MAX_MASKED_TOKENS
from .runner import CudaRunner

__all__ = ["CudaHybridRunner", "HYBRID_NOTE"]

HYBRID_NOTE = ("a hybrid (qwen35) model decodes on the per-op CUDA graph (the persistent forward has no Gated "
               "DeltaNet stage); draft trees are verified eagerly")


class CudaHybridRunner(CudaRunner):
    device_tree = False     # its verify keeps a recurrent state per node of the host's tree (forward_tree below)

    def __init__(self, ops, cfg, weights, max_ctx: int, prefill_chunk: int = 512, kv_types=None,
                 max_tree_nodes: int | None = None):
        super().__init__(ops, cfg, weights, max_ctx, prefill_chunk, forward_path="graph", kv_types=kv_types,
                         max_tree_nodes=max_tree_nodes)
        self.forward_note = HYBRID_NOTE

    @property
    def max_tree_nodes(self) -> int:
        """CudaRunner's bound (masked attention, the prefill chunk) and the hybrid cache's (a state per node: the
        configured cap, hybrid_plan.hybrid_tree_nodes)."""
        return min(self.prefill_chunk, MAX_MASKED_TOKENS, self.cache.max_tree_nodes)

    # -- the decode graph ------------------------------------------------------------------------------------
    def _step_forward(self, batch: Batch):
        """The decode step's forward (captured): the state continues (the runner clears it where a sequence
        starts, greedy_continue), nothing is read back."""
        return qwen35_forward(self.ops, self.cfg, self.weights, self.cache, batch, new_sequence=False)

    def _capture(self, body):
        self.ops.prepare_capture(self.cfg)      # l2_norm's weight (the composition past the fused kernels)
        return super()._capture(body)

    def greedy_continue(self, feed, n_new: int) -> list[int]:
        """CudaRunner.greedy_continue (graph replays), with what the eager forward would decide on the host done
        first: the node states are stale, and a chain from an empty context starts a new sequence."""
        self._before_replays()
        return super().greedy_continue(feed, n_new)

    def greedy_stream(self, feed, n_new: int) -> Iterator[int]:
        """CudaRunner.greedy_stream, after what greedy_continue does first."""
        self._before_replays()
        yield from super().greedy_stream(feed, n_new)

    def _before_replays(self) -> None:
        self.cache.end_tree()
        if self.n_past == 0:
            self.cache.clear_state()

    # -- draft trees: eager ----------------------------------------------------------------------------------
    def forward_tree(self, ids, positions, mask, *, hidden_sink=None, capture=()):
        """ModelRunner.forward_tree, eager: CudaRunner's verify body (row invariant; capture's feature rows copied
        on the device) over the inputs uploaded in one copy; logits (n, vocab) on the device."""
        n, capture = self._upload_tree(ids, positions, mask, capture)
        return self._tree_body(n, hidden_sink, capture)

    def commit_tree(self, node_offsets) -> None:
        """ModelRunner.commit_tree: the live state <- the path's last node's (HybridCache.keep_tree_path), then
        the path's K/V to the next slots (Ops.kv_compact on the attention layers' cache)."""
        offsets = np.asarray(node_offsets, np.int32)
        n = len(offsets)
        self._will_write(n)
        self.cache.keep_tree_path(offsets)
        if np.any(offsets != np.arange(n)):
            self.ops.kv_compact(self.cache.kv, self.n_past, offsets)
        self.n_past += n
