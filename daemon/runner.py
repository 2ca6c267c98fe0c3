"""ModelRunner: one resident model, its KV cache and the prefill/decode loop (batch 1).

The runner knows tokens, not text: stop strings, streaming and cancellation live in the engine.
A backend with its own fast path (the CUDA decode graph) subclasses this and overrides `generate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..protocol.messages import SamplingParams
from .backends.base import Batch, KVCacheSpec
from .models.config import ModelConfig
from .models.dense import forward
from .models.weights import ModelWeights
from .sampling import log_softmax, sample

__all__ = ["ModelRunner", "Sampled"]


@dataclass(slots=True)
class Sampled:
    """One generated token; logprob and top are from the model's distribution (before penalties
    and temperature), present when the request asked for logprobs."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


class ModelRunner:
    def __init__(self, ops, cfg: ModelConfig, weights: ModelWeights, max_ctx: int,
                 prefill_chunk: int = 512):
        if max_ctx <= 0 or prefill_chunk <= 0:
            raise ValueError("max_ctx and prefill_chunk must be positive")
        self.ops, self.cfg, self.weights = ops, cfg, weights
        self.max_ctx, self.prefill_chunk = max_ctx, prefill_chunk
        self.cache = ops.kv_cache(KVCacheSpec(cfg.n_layers, max_ctx, cfg.n_kv_heads, cfg.head_dim))
        self.n_past = 0   # cache slots [0, n_past) hold committed context

    # -- forward passes --------------------------------------------------------------------------
    def _forward(self, ids: list[int] | np.ndarray, *, all_logits: bool, hidden_sink=None) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int32)
        n = len(ids)
        if self.n_past + n > self.max_ctx:
            raise ValueError(f"context overflow: {self.n_past} + {n} > max_ctx {self.max_ctx}")
        ops = self.ops
        ops.begin_forward()
        batch = Batch(ids=ops.from_numpy(ids),
                      positions=ops.from_numpy(np.arange(self.n_past, self.n_past + n, dtype=np.int32)),
                      n_past=ops.from_numpy(np.array([self.n_past], np.int32)), n_tokens=n)
        logits = forward(ops, self.cfg, self.weights, self.cache, batch, all_logits=all_logits,
                         hidden_sink=hidden_sink)
        self.n_past += n
        return ops.to_numpy(logits)

    def prefill(self, ids, *, all_logits: bool = False, hidden_sink=None) -> np.ndarray:
        """Append `ids` to the context in chunks; logits of the last token (1, vocab), or of
        every token (n, vocab) with all_logits. hidden_sink: see models.dense.forward."""
        if len(ids) == 0:
            raise ValueError("prefill needs at least one token")
        outs = []
        for start in range(0, len(ids), self.prefill_chunk):
            outs.append(self._forward(ids[start:start + self.prefill_chunk], all_logits=all_logits,
                                      hidden_sink=hidden_sink))
        return np.concatenate(outs) if all_logits else outs[-1]

    def reset(self) -> None:
        self.n_past = 0

    # -- speculative decoding (daemon/spec/decoder.py) -------------------------------------------
    @property
    def max_tree_nodes(self) -> int:
        """The largest tree `forward_tree` takes (nodes, root included)."""
        return self.prefill_chunk

    def forward_tree(self, ids, positions, mask, *, hidden_sink=None):
        """Forward the nodes of a draft tree without committing them: node i at RoPE position
        positions[i] writes K/V to slot n_past + i and attends the committed context plus the
        nodes j with mask[i, j] (bool (n, n)). Returns the logits (n, vocab) as a backend tensor,
        valid until the next forward. n_past is unchanged; `commit_tree` keeps a path."""
        ids = np.asarray(ids, np.int32)
        n = len(ids)
        if self.n_past + n > self.max_ctx:
            raise ValueError(f"context overflow: {self.n_past} + {n} > max_ctx {self.max_ctx}")
        ops = self.ops
        ops.begin_forward()
        batch = Batch(ids=ops.from_numpy(ids), positions=ops.from_numpy(np.asarray(positions, np.int32)),
                      n_past=ops.from_numpy(np.array([self.n_past], np.int32)),
                      mask=ops.from_numpy(np.asarray(mask, bool)), n_tokens=n)
        return forward(ops, self.cfg, self.weights, self.cache, batch, all_logits=True, hidden_sink=hidden_sink)

    def commit_tree(self, node_offsets) -> None:
        """Keep the nodes at slots n_past + node_offsets (ascending, node_offsets[k] >= k) as the
        next len(node_offsets) committed slots."""
        offsets = np.asarray(node_offsets, np.int32)
        if self.n_past + len(offsets) > self.max_ctx:
            raise ValueError(f"context overflow: {self.n_past} + {len(offsets)} > max_ctx {self.max_ctx}")
        if np.any(offsets != np.arange(len(offsets))):
            self.ops.kv_compact(self.cache, self.n_past, offsets)
        self.n_past += len(offsets)

    def greedy_continue(self, feed, n_new: int) -> list[int]:
        """Append `feed` to the context, then greedily choose n_new >= 1 tokens (plain argmax, no
        penalties); the context ends holding feed + all but the last chosen token (a drafter's
        chain). The CUDA runner replays its captured decode graph here."""
        if n_new < 1 or len(feed) == 0:
            raise ValueError("greedy_continue needs a non-empty feed and n_new >= 1")
        logits = self.prefill(list(feed))[0]
        out = [int(np.argmax(logits))]
        while len(out) < n_new:
            out.append(int(np.argmax(self._forward([out[-1]], all_logits=False)[0])))
        return out

    def logits_to_host(self, logits) -> np.ndarray:
        return np.asarray(self.ops.to_numpy(logits))

    def argmax_rows(self, logits) -> np.ndarray:
        """int (n,): the argmax of each row (lowest id wins a tie, as sampling.sample)."""
        return np.argmax(self.logits_to_host(logits), axis=-1)

    def score(self, ids) -> np.ndarray:
        """Teacher forcing: logits (n, vocab) at every position of `ids`, from an empty context."""
        self.reset()
        try:
            return self.prefill(ids, all_logits=True)
        finally:
            self.reset()

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompt: list[int], params: SamplingParams, max_new_tokens: int,
                 logprobs: int = 0) -> Iterator[Sampled]:
        """Prefill `prompt` into an empty context, then yield up to max_new_tokens tokens.

        The consumer stops early by closing the iterator (stop strings, cancel). The context
        holds prompt + every token yielded except the last one, which has not been forwarded.
        """
        self.reset()
        history = list(prompt)
        logits = self.prefill(prompt)[0]
        for step in range(max_new_tokens):
            token = sample(logits, np.asarray(history), params, step)
            yield self._sampled(token, logits, logprobs)
            history.append(token)
            if step + 1 < max_new_tokens:
                logits = self._forward([token], all_logits=False)[0]

    @staticmethod
    def _sampled(token: int, logits: np.ndarray, n_top: int) -> Sampled:
        if n_top <= 0:
            return Sampled(token)
        lp = log_softmax(logits)
        top = np.argsort(-lp, kind="stable")[:n_top]
        return Sampled(token, float(lp[token]), [(int(t), float(lp[t])) for t in top])
