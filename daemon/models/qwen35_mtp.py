"""The qwen35 multi-token-prediction (MTP) block's forward, written once against the backend `Ops` (what
llama.cpp's graph_mtp in src/models/qwen35.cpp computes; weights: qwen35_mtp_weights.py).

For position p the block reads the token x_p and h, the target's final hidden state at position p - 1 after
output_norm (the row the target's lm_head reads to predict x_p), and predicts x_{p+1}:

    e = rmsnorm(embed(x_p), enorm)        hh = rmsnorm(h, hnorm)
    y = eh_proj @ [e | hh]                (eh_proj_e e + eh_proj_h hh)
    y = qwen35.decoder_layer(y)           one gated-attention block: its own K/V cache (one layer), RoPE at p
    g = rmsnorm(y, head_norm)             the block's own "h": the next draft step's h
    logits = head @ g

The block's K/V cache holds one entry per position of the sequence, position p from the pair (x_p, h_{p-1})
(h_{-1}: zeros, as llama.cpp pairs the first token of a sequence with a zero row). Speculative drafting
(speculative/mtp_drafter.py) keeps it so.

`target_hidden` gives the h rows: the target's last layer output, output-normed with the target's own op and
weight, exactly what its lm_head reads (the drafter captures the last layer through the speculative decoder's
hidden sink, so a target with no MTP drafter in use pays nothing).
"""
from __future__ import annotations

from ..backends.base import Batch, KVCacheSpec
from .config import ModelConfig
from .qwen35 import decoder_layer
from .qwen35_mtp_weights import MTPWeights

__all__ = ["mtp_forward", "mtp_cache_spec", "target_hidden"]


def mtp_cache_spec(cfg: ModelConfig, max_ctx: int) -> KVCacheSpec:
    """The block's own K/V cache: one layer, a slot per position of the target's context."""
    return KVCacheSpec(1, max_ctx, cfg.n_kv_heads, cfg.head_dim)


def target_hidden(ops, cfg: ModelConfig, target_weights, h_last):
    """The target's output-normed hidden rows from its last layer's output rows (models.dense.run_layers' norm)."""
    return ops.rmsnorm(h_last, target_weights.output_norm, cfg.rms_eps)


def mtp_forward(ops, cfg: ModelConfig, w: MTPWeights, cache, batch: Batch, h_prev, *, all_logits: bool = False):
    """(logits, g): logits (n, vocab) for every row, or (1, vocab) for the last one; g the block's normed output
    rows (n, D), or the last row (1, D). batch: tokens x_p at positions p, slots n_past + i (causal, mask None);
    h_prev (n, D) float32: the target's (or, along a draft chain, the block's own) normed hidden row of p - 1."""
    eps = cfg.rms_eps
    e = ops.rmsnorm(ops.embed(w.embed, batch.ids), w.enorm, eps)
    hh = ops.rmsnorm(h_prev, w.hnorm, eps)
    y = ops.linear(hh, w.eh_proj_h, residual=ops.linear(e, w.eh_proj_e))
    ops.begin_layer(0)              # scratch as a target forward's layers recycle it (models.dense.run_layers)
    y = decoder_layer(ops, cfg, y, w.block, cache.layer(0), batch)
    ops.begin_layer(1)
    if not all_logits and batch.n_tokens > 1:
        y = y[batch.n_tokens - 1:]
    g = ops.rmsnorm(y, w.head_norm, eps)
    return ops.linear(g, w.head), g
