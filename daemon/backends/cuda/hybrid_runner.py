"""CudaHybridRunner: a hybrid (qwen35) model on the GPU, every forward eager (per op, nothing captured).

Why eager: the forward runs a few elementwise ops on the host (hybrid_ops.HOST_OPS: no sigmoid / softplus /
product kernel in the C ABI yet) and models.qwen35.forward reads n_past back to decide whether a sequence starts;
both synchronize the stream, which a CUDA-graph capture forbids. So the decode loop is ModelRunner's (a forward
per token, the token chosen on the host from the downloaded logits) instead of CudaRunner's graph replays, and
greedy_continue (a drafter's chain) is ModelRunner's too. Prefill, scoring, prefix reuse, checkpoint / rewind
are CudaRunner's / ModelRunner's unchanged: they already run the model's own forward eagerly.

Draft tree verification (forward_tree / commit_tree) is refused (recurrent_state.TREE_UNSUPPORTED): the node
states are not on the device yet. `tree_unsupported` says so in short: a speculative request on such a runner is
decoded plainly (daemon/generation.py; the same tokens, its done.spec says "unsupported": that reason), as the
reference backend did with hybrids before it verified trees.
"""
from __future__ import annotations

from typing import Iterator

from ....protocol.messages import SamplingParams
from ...runner import ModelRunner, Sampled
from .recurrent_state import TREE_UNSUPPORTED, TreeVerifyUnsupported
from .runner import CudaRunner

__all__ = ["CudaHybridRunner"]

EAGER_NOTE = ("a hybrid (qwen35) model runs eagerly on the CUDA backend: its forward has host steps "
              "(cuda/hybrid_ops.py HOST_OPS), which a CUDA graph cannot capture")


class CudaHybridRunner(CudaRunner):
    tree_unsupported = "hybrid target on the CUDA backend"   # generation.py: decode plainly, done.spec says why

    def __init__(self, ops, cfg, weights, max_ctx: int, prefill_chunk: int = 512, kv_types=None):
        super().__init__(ops, cfg, weights, max_ctx, prefill_chunk, forward_path="graph", kv_types=kv_types)
        self.forward_path = "eager"
        self.forward_note = EAGER_NOTE

    @property
    def max_tree_nodes(self) -> int:
        return 1                            # the root alone: no drafted node fits (and forward_tree refuses)

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
        raise TreeVerifyUnsupported(TREE_UNSUPPORTED)

    def commit_tree(self, node_offsets) -> None:
        raise TreeVerifyUnsupported(TREE_UNSUPPORTED)
