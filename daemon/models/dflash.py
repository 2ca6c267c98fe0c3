"""The DFlash block drafter (ARCHITECTURE.md, DFlash block drafter), written once against the backend `Ops`.

    F     = hidden_norm(fc @ concat(target layer outputs))      context features, (m, D) per new position
    h     = target.embed([last_token, MASK x (B-1)])             the block, at positions pos .. pos+B-1
    layer:  Q from the block only; K, V from [F ; block] with the same weights ("KV injection");
            attention is non-causal over every context position + the whole block
    out   = target.lm_head(norm(h[1:]))                          B-1 drafted distributions

The context never enters the residual stream, so its K/V in a layer depend only on F and that
layer's Wk, Wv, k_norm: they are computed once per committed position (`inject_context`) and kept
in the drafter's own KV cache, slot = absolute position. A draft step (`draft_block`) writes the
block's K/V after the committed slots (scratch, overwritten by the next step's context) and
attends everything below -- B query rows, no recomputation of the context (the anchor recomputes
up to 4096 positions every step).

The block layers are plain Qwen3 decoder layers over a Batch whose mask over the new tokens is all
true, so `dense.decoder_layer` runs them unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.base import Batch, KVCacheSpec
from .dense import decoder_layer
from .dflash_config import DFlashConfig
from .dflash_weights import DFlashWeights

__all__ = ["TargetHead", "context_features", "inject_context", "draft_block", "dflash_cache_spec",
           "block_mask", "block_batch"]


@dataclass(slots=True)
class TargetHead:
    """What the drafter borrows from its target: the token embedding and the lm_head."""

    token_embd: Any     # (vocab, D)
    output: Any         # (vocab, D); the same tensor as token_embd when the target ties them


def dflash_cache_spec(cfg: DFlashConfig, max_ctx: int) -> KVCacheSpec:
    """The drafter's KV cache: one slot per target position plus the block's B scratch slots."""
    m = cfg.model
    return KVCacheSpec(m.n_layers, max_ctx + cfg.block_size, m.n_kv_heads, m.head_dim)


def context_features(ops, cfg: DFlashConfig, w: DFlashWeights, features):
    """hidden_norm(fc @ concat(features)) as sum_j fc_j @ features[j]; features: n_features x (m, D)."""
    if len(features) != cfg.n_features:
        raise ValueError(f"DFlash context needs {cfg.n_features} target layer outputs, got {len(features)}")
    acc = None
    for fc_j, x in zip(w.fc, features):
        acc = ops.linear(x, fc_j, residual=acc)
    return ops.rmsnorm(acc, w.hidden_norm, cfg.model.rms_eps)


def inject_context(ops, cfg: DFlashConfig, w: DFlashWeights, cache, features, positions, start) -> None:
    """Append m newly committed positions to every layer's context K/V.

    features: n_features tensors (m, D), the target's layer outputs at target_layer_ids for those
    positions; positions int32 (m,) their absolute positions (RoPE); start int32 (1,) the cache slot
    of the first (== positions[0] when the context is complete from position 0).
    Runs inside one forward (the caller calls ops.begin_forward()); it uses no begin_layer, so F
    stays live across layers.
    """
    f = context_features(ops, cfg, w, features)
    m, n = cfg.model, int(features[0].shape[0])
    for i, layer in enumerate(w.layers):
        k = ops.linear(f, layer.attn_k).reshape(n, m.n_kv_heads, m.head_dim)
        v = ops.linear(f, layer.attn_v).reshape(n, m.n_kv_heads, m.head_dim)
        k = ops.rope(ops.rmsnorm(k, layer.attn_k_norm, m.rms_eps), positions, m.rope_theta, m.rope_dim, m.rope_neox)
        ops.kv_write(k, v, cache.layer(i), start)


def block_mask(ops, cfg: DFlashConfig):
    """The (B, B) all-true mask over the block (non-causal); make it once, it never changes."""
    return ops.from_numpy(np.ones((cfg.block_size, cfg.block_size), np.bool_))


def block_batch(cfg: DFlashConfig, ids, positions, n_ctx, mask) -> Batch:
    """The block as a Batch: ids/positions int32 (B,), n_ctx int32 (1,) committed context slots,
    mask from `block_mask`."""
    return Batch(ids=ids, positions=positions, n_past=n_ctx, mask=mask, n_tokens=cfg.block_size)


def draft_block(ops, cfg: DFlashConfig, w: DFlashWeights, head: TargetHead, cache, batch: Batch):
    """Logits (B-1, vocab) for the block's masked positions 1..B-1.

    batch: `block_batch(...)`: ids [last_token, MASK x (B-1)], positions from the root's absolute
    position on (n_ctx .. n_ctx+B-1 when the context has no gaps), and n_past = n_ctx, the number
    of context rows already injected (cache slots).
    """
    h = ops.embed(head.token_embd, batch.ids)                           # (B, D)
    for i, layer in enumerate(w.layers):
        ops.begin_layer(i)
        h = decoder_layer(ops, cfg.model, h, layer, cache.layer(i), batch)
    ops.begin_layer(len(w.layers))
    h = h[1:]                                                           # the B-1 masked positions
    return ops.linear(ops.rmsnorm(h, w.output_norm, cfg.model.rms_eps), head.output)
