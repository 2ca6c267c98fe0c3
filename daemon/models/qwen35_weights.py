"""GGUF tensor-name map of a qwen35 model's layers (llama.cpp's names and shapes; numpy shapes, y = W @ x).

Every layer has attn_norm, post_attention_norm (the norm before the MLP) and the SwiGLU MLP; a full-attention
layer adds Q (with its output gate interleaved per head: rows [q_h | gate_h] for each head h), K, V, the per-head
q/k RMSNorms and the output; a linear-attention (Gated DeltaNet) layer adds the q/k/v projection into the
convolution, the gate z of the output norm, the convolution, the decay (alpha, dt bias, A), beta, the output
norm and the output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import ModelConfig

__all__ = ["AttentionLayerWeights", "LinearLayerWeights", "qwen35_layer_table"]


def _always(cfg: ModelConfig) -> bool:
    return True


@dataclass(slots=True)
class AttentionLayerWeights:
    attn_norm: Any
    attn_q: Any          # (2 H d, D): per head h, rows [q_h (d) | gate_h (d)]
    attn_k: Any
    attn_v: Any
    attn_q_norm: Any
    attn_k_norm: Any
    attn_output: Any
    post_attention_norm: Any
    ffn_gate: Any
    ffn_up: Any
    ffn_down: Any


@dataclass(slots=True)
class LinearLayerWeights:
    attn_norm: Any
    attn_qkv: Any        # (2 Hk S + Hv S, D): the q, k, v channels of the convolution
    attn_gate: Any       # (Hv S, D): z, the gate of the output norm
    ssm_conv1d: Any      # (2 Hk S + Hv S, K)
    ssm_dt: Any          # (Hv,) bias of the decay's softplus
    ssm_a: Any           # (Hv,) -exp(A_log)
    ssm_alpha: Any       # (Hv, D)
    ssm_beta: Any        # (Hv, D)
    ssm_norm: Any        # (S,)
    ssm_out: Any         # (D, Hv S)
    post_attention_norm: Any
    ffn_gate: Any
    ffn_up: Any
    ffn_down: Any


_COMMON = {
    "attn_norm": ("blk.{i}.attn_norm.weight", lambda c: (c.hidden,), _always),
    "post_attention_norm": ("blk.{i}.post_attention_norm.weight", lambda c: (c.hidden,), _always),
    "ffn_gate": ("blk.{i}.ffn_gate.weight", lambda c: (c.ffn, c.hidden), _always),
    "ffn_up": ("blk.{i}.ffn_up.weight", lambda c: (c.ffn, c.hidden), _always),
    "ffn_down": ("blk.{i}.ffn_down.weight", lambda c: (c.hidden, c.ffn), _always),
}
ATTENTION_TENSORS = {
    "attn_q": ("blk.{i}.attn_q.weight", lambda c: (2 * c.q_dim, c.hidden), _always),
    "attn_k": ("blk.{i}.attn_k.weight", lambda c: (c.kv_dim, c.hidden), _always),
    "attn_v": ("blk.{i}.attn_v.weight", lambda c: (c.kv_dim, c.hidden), _always),
    "attn_q_norm": ("blk.{i}.attn_q_norm.weight", lambda c: (c.head_dim,), _always),
    "attn_k_norm": ("blk.{i}.attn_k_norm.weight", lambda c: (c.head_dim,), _always),
    "attn_output": ("blk.{i}.attn_output.weight", lambda c: (c.hidden, c.q_dim), _always),
    **_COMMON,
}
LINEAR_TENSORS = {
    "attn_qkv": ("blk.{i}.attn_qkv.weight", lambda c: (c.linear.conv_channels, c.hidden), _always),
    "attn_gate": ("blk.{i}.attn_gate.weight", lambda c: (c.linear.value_dim, c.hidden), _always),
    "ssm_conv1d": ("blk.{i}.ssm_conv1d.weight", lambda c: (c.linear.conv_channels, c.linear.conv_kernel), _always),
    "ssm_dt": ("blk.{i}.ssm_dt.bias", lambda c: (c.linear.n_v_heads,), _always),
    "ssm_a": ("blk.{i}.ssm_a", lambda c: (c.linear.n_v_heads,), _always),
    "ssm_alpha": ("blk.{i}.ssm_alpha.weight", lambda c: (c.linear.n_v_heads, c.hidden), _always),
    "ssm_beta": ("blk.{i}.ssm_beta.weight", lambda c: (c.linear.n_v_heads, c.hidden), _always),
    "ssm_norm": ("blk.{i}.ssm_norm.weight", lambda c: (c.linear.head_dim,), _always),
    "ssm_out": ("blk.{i}.ssm_out.weight", lambda c: (c.hidden, c.linear.value_dim), _always),
    **_COMMON,
}


def qwen35_layer_table(cfg: ModelConfig, i: int) -> tuple[dict, type]:
    """(field -> (GGUF name, shape, needed), the layer's weights class) of layer i."""
    if cfg.linear.recurrent[i]:
        return LINEAR_TENSORS, LinearLayerWeights
    return ATTENTION_TENSORS, AttentionLayerWeights
