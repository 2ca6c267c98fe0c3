"""The dense GQA decoder (llama, qwen2, qwen3), written once against the backend `Ops`.

    h = embed(ids)
    for each layer:  h = h + attention(rmsnorm(h)) ;  h = h + swiglu_mlp(rmsnorm(h))
    logits = lm_head(rmsnorm(h))
"""
from __future__ import annotations

from ..backends.base import Batch
from .config import ModelConfig
from .weights import LayerWeights, ModelWeights

__all__ = ["forward", "decoder_layer", "run_layers"]


def attention_block(ops, cfg: ModelConfig, x, w: LayerWeights, cache_layer, batch: Batch, residual):
    n = batch.n_tokens
    q, k, v = ops.linear_multi(x, (w.attn_q, w.attn_k, w.attn_v), (w.attn_q_bias, w.attn_k_bias, w.attn_v_bias))
    q = q.reshape(n, cfg.n_heads, cfg.head_dim)
    k = k.reshape(n, cfg.n_kv_heads, cfg.head_dim)
    v = v.reshape(n, cfg.n_kv_heads, cfg.head_dim)
    if cfg.qk_norm:                                     # qwen3: RMSNorm over each head's d
        q = ops.rmsnorm(q, w.attn_q_norm, cfg.rms_eps)
        k = ops.rmsnorm(k, w.attn_k_norm, cfg.rms_eps)
    q = ops.rope(q, batch.positions, cfg.rope_theta, cfg.rope_dim, cfg.rope_neox, cfg.rope_scaling)
    k = ops.rope(k, batch.positions, cfg.rope_theta, cfg.rope_dim, cfg.rope_neox, cfg.rope_scaling)
    o = ops.attention(q, k, v, cache_layer, batch)      # (n, H * d)
    return ops.linear(o, w.attn_output, residual=residual)


def mlp_block(ops, x, w: LayerWeights, residual):
    return ops.linear(ops.linear_swiglu(x, w.ffn_gate, w.ffn_up), w.ffn_down, residual=residual)


def decoder_layer(ops, cfg: ModelConfig, h, w: LayerWeights, cache_layer, batch: Batch):
    h = attention_block(ops, cfg, ops.rmsnorm(h, w.attn_norm, cfg.rms_eps), w, cache_layer, batch, h)
    return mlp_block(ops, ops.rmsnorm(h, w.ffn_norm, cfg.rms_eps), w, h)


def forward(ops, cfg: ModelConfig, weights: ModelWeights, cache, batch: Batch, *,
            all_logits: bool = False, hidden_sink=None):
    """Logits (n, vocab) for every new token, or (1, vocab) for the last one only.

    hidden_sink(layer_index, h) sees each layer's output (speculative decoding's feature capture).
    """
    return run_layers(ops, cfg, weights, cache, batch, decoder_layer, all_logits, hidden_sink)


def run_layers(ops, cfg: ModelConfig, weights: ModelWeights, cache, batch: Batch, layer_fn, all_logits: bool,
               hidden_sink):
    """embed -> layer_fn(ops, cfg, h, layer weights, cache.layer(i), batch) per layer -> lm head: the forward
    pass every decoder shares (this one's and models.qwen35's), its layers aside."""
    h = ops.embed(weights.token_embd, batch.ids)
    for i, layer in enumerate(weights.layers):
        ops.begin_layer(i)          # a backend may recycle the previous layer's scratch here
        h = layer_fn(ops, cfg, h, layer, cache.layer(i), batch)
        if hidden_sink is not None:
            hidden_sink(i, h)
    ops.begin_layer(len(weights.layers))
    if not all_logits and batch.n_tokens > 1:
        h = h[batch.n_tokens - 1:]
    return ops.linear(ops.rmsnorm(h, weights.output_norm, cfg.rms_eps), weights.output)
