"""The PFlash drafter: a dense-family model that reads the whole prompt with FlashPrefill attention
and scores every token by how much the last T prompt tokens attend to it (ARCHITECTURE.md, PFlash).

The forward runs in chunks of `forward_chunk` tokens (a multiple of 128, so that every chunk's
query blocks are whole absolute blocks; the last chunk absorbs a short remainder so it holds at
least T tokens). Each layer writes its K/V to the drafter's own cache (sized for the prompt,
allocated per call and released after it) and attends with `ops.flashprefill_attention`; in the last
chunk each layer also folds the dense attention probabilities of the T tail queries into a
running max (`ops.tail_max_probs`), which ends as the (T, S) max over layers and heads. No LM head.

Only the first `layers` layers run (PFlashConfig.score_layers, 0 = all): the max over layers needs
no later layer, and the last layer run stops after its attention (its output projection and MLP
feed nothing), so scoring with L of N layers costs about L / N of the full forward. Layers below
`first` (PFlashConfig.score_from) run but do not score.
"""
from __future__ import annotations

import numpy as np

from ..backends.base import Batch, KVCacheSpec
from ..models import LoadedModel
from ..models.dense import mlp_block
from .config import PFlashConfig
from .flashprefill import BLOCK, FlashPrefillStep

__all__ = ["Drafter", "chunk_bounds"]


def chunk_bounds(n_tokens: int, chunk: int, min_last: int) -> list[tuple[int, int]]:
    """[(start, end)) forward chunks: starts at multiples of `chunk`; a last chunk shorter than
    `min_last` is merged into the one before it."""
    bounds = [(s, min(n_tokens, s + chunk)) for s in range(0, n_tokens, chunk)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < min_last:
        bounds[-2:] = [(bounds[-2][0], n_tokens)]
    return bounds


class Drafter:
    """A loaded drafter: its ops (own activation arena on the GPU), weights and tokenizer."""

    def __init__(self, ops, model: LoadedModel, tokenizer, config: PFlashConfig):
        self.ops, self.model, self.tokenizer, self.config = ops, model, tokenizer, config

    @property
    def path(self):
        return self.model.path

    def score_window(self, layers: int | None = None, first: int | None = None) -> tuple[int, int]:
        """[first, end) of the layers whose attention scores; a forward runs layers [0, end).
        `layers` (else the config's score_layers): 0 = all, at most the model's; `first` (else the
        config's score_from) must be below end."""
        n = self.config.score_layers if layers is None else int(layers)
        lo = self.config.score_from if first is None else int(first)
        if n < 0:
            raise ValueError(f"score layers must be >= 0 (0 = every layer), got {n}")
        n_layers = self.model.config.n_layers
        end = n_layers if n == 0 else min(n, n_layers)
        if not 0 <= lo < end:
            raise ValueError(f"first scoring layer {lo} must be in [0, {end}) (the layers run)")
        return lo, end

    def tail_probs(self, ids, alpha: float | None = None, layers: int | None = None,
                   first: int | None = None) -> np.ndarray:
        """(T, S) float32: for each of the last T = min(tail_tokens, S) prompt tokens, the max
        over the layers of score_window(layers, first) and all heads of its attention probability
        on every prompt token."""
        ops, cfg, pc = self.ops, self.model.config, self.config
        first, n_run = self.score_window(layers, first)
        ids = np.asarray(ids, np.int32)
        n_tokens = len(ids)
        n_tail = min(pc.tail_tokens, n_tokens)
        n_blocks = -(-n_tokens // BLOCK)
        bounds = chunk_bounds(n_tokens, pc.forward_chunk, n_tail)
        if hasattr(ops, "reserve_arena"):   # the GPU arena: one layer of the largest chunk + FlashPrefill scratch
            from ..backends.cuda.backend import _arena_half_bytes
            longest = max(e - s for s, e in bounds)
            extra = 4 * (2 * -(-longest // BLOCK) * cfg.n_heads * n_blocks + n_blocks * cfg.kv_dim
                         + 2 * n_tail * cfg.n_heads) + 8 * 256
            ops.reserve_arena(_arena_half_bytes(cfg, longest) + extra)
        cache = ops.kv_cache(KVCacheSpec(n_run, n_blocks * BLOCK, cfg.n_kv_heads, cfg.head_dim))
        acc = ops.from_numpy(np.zeros((n_tail, n_tokens), np.float32))
        weights = self.model.weights
        for start, end in bounds:
            step = FlashPrefillStep(p0=start, first_full_block=max(n_blocks - pc.last_full_blocks, 0),
                                    alpha=pc.alpha if alpha is None else alpha, sink_blocks=pc.sink_blocks,
                                    window_blocks=pc.window_blocks)
            tail = (n_tokens, n_tail, acc) if end == n_tokens else None
            ops.begin_forward()
            batch = Batch(ids=ops.from_numpy(ids[start:end]),
                          positions=ops.from_numpy(np.arange(start, end, dtype=np.int32)),
                          n_past=ops.from_numpy(np.array([start], np.int32)), n_tokens=end - start)
            h = ops.embed(weights.token_embd, batch.ids)
            for i, layer in enumerate(weights.layers[:n_run]):
                ops.begin_layer(i)
                x = ops.rmsnorm(h, layer.attn_norm, cfg.rms_eps)
                last = i == n_run - 1                  # its attention output feeds nothing
                h = self._attention(x, layer, cache.layer(i), batch, step, tail if i >= first else None, h,
                                    project=not last)
                if not last:
                    h = mlp_block(ops, ops.rmsnorm(h, layer.ffn_norm, cfg.rms_eps), layer, h)
        out = ops.to_numpy(acc)
        del cache
        return out

    def _attention(self, x, w, cache_layer, batch: Batch, step: FlashPrefillStep, tail, residual, project=True):
        """dense.attention_block with FlashPrefill attention, plus the tail scoring; without
        `project`, the attention only writes the K/V cache and scores (returns None)."""
        ops, cfg = self.ops, self.model.config
        n = batch.n_tokens
        q, k, v = ops.linear_multi(x, (w.attn_q, w.attn_k, w.attn_v), (w.attn_q_bias, w.attn_k_bias, w.attn_v_bias))
        q = q.reshape(n, cfg.n_heads, cfg.head_dim)
        k = k.reshape(n, cfg.n_kv_heads, cfg.head_dim)
        v = v.reshape(n, cfg.n_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = ops.rmsnorm(q, w.attn_q_norm, cfg.rms_eps)
            k = ops.rmsnorm(k, w.attn_k_norm, cfg.rms_eps)
        q = ops.rope(q, batch.positions, cfg.rope_theta, cfg.rope_dim, cfg.rope_neox, cfg.rope_scaling)
        k = ops.rope(k, batch.positions, cfg.rope_theta, cfg.rope_dim, cfg.rope_neox, cfg.rope_scaling)
        o = ops.flashprefill_attention(q, k, v, cache_layer, batch, step)
        if tail is not None:
            n_keys, n_tail, acc = tail
            ops.tail_max_probs(q, cache_layer, n_keys, n_tail, acc)
        return ops.linear(o, w.attn_output, residual=residual) if project else None
