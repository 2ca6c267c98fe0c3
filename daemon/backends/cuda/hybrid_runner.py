"""CudaHybridRunner: a hybrid (qwen35) model on the GPU, every forward eager (per op, nothing captured).

Why eager: the forward runs a few elementwise ops on the host (hybrid_ops.HOST_OPS: no sigmoid / softplus /
product kernel in the C ABI yet) and models.qwen35.forward reads n_past back to decide whether a sequence starts;
both synchronize the stream, which a CUDA-graph capture forbids. So the decode loop is ModelRunner's (a forward
per token, the token chosen on the host from the downloaded logits) instead of CudaRunner's graph replays, and
greedy_continue (a drafter's chain) is ModelRunner's too. Prefill, scoring, prefix reuse, checkpoint / rewind
are CudaRunner's / ModelRunner's unchanged: they already run the model's own forward eagerly.

Draft trees are verified eagerly too (forward_tree: CudaRunner's verify body, row invariant, without a graph;
commit_tree: the recurrent state of the accepted path's last node, then the K/V move): the linear layers run the
causal_conv1d_tree / gated_delta_rule_tree kernels from a state per node (recurrent_state.py), whose outputs are
bitwise decode steps along each node's path, so speculative decoding gives this runner's plain greedy tokens.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ....protocol.messages import SamplingParams
from ...runner import ModelRunner, Sampled
from .ops import MAX_MASKED_TOKENS
from .runner import CudaRunner

__all__ = ["CudaHybridRunner"]

EAGER_NOTE = ("a hybrid (qwen35) model runs eagerly on the CUDA backend: its forward has host steps "
              "(cuda/hybrid_ops.py HOST_OPS), which a CUDA graph cannot capture")


class CudaHybridRunner(CudaRunner):
    def __init__(self, ops, cfg, weights, max_ctx: int, prefill_chunk: int = 512, kv_types=None):
        super().__init__(ops, cfg, weights, max_ctx, prefill_chunk, forward_path="graph", kv_types=kv_types)
        self.forward_path = "eager"
        self.forward_note = EAGER_NOTE

    @property
    def max_tree_nodes(self) -> int:
        """CudaRunner's bound (masked attention, the prefill chunk) and the hybrid cache's (a state per node)."""
        return min(self.prefill_chunk, MAX_MASKED_TOKENS, self.cache.max_tree_nodes)

    def _warm_up(self) -> None:
        """Nothing to capture (CudaRunner warms up and captures its decode graph here)."""

    def _graph(self, params):
        raise RuntimeError(EAGER_NOTE)      # never reached: generate / greedy_continue below do not replay

    def generate(self, prompt: list[int], params: SamplingParams, max_new_tokens: int,
                 logprobs: int = 0) -> Iterator[Sampled]:
        """ModelRunner.generate: a forward per token, selection on the host (sampling.sample)."""
        yield from ModelRunner.generate(self, prompt, params, max_new_tokens, logprobs)

    def greedy_continue(self, feed, n_new: int) -> list[int]:
        return ModelRunner.greedy_continue(self, feed, n_new)

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
