"""The CUDA backend's memory plan and load-time checks for a hybrid (qwen35) model: what its Gated DeltaNet layers
add to a dense model's plan (backend.py) -- the recurrent state beside the K/V of the attention layers and a
state per node of the largest draft tree a verify takes (recurrent_state.py's node buffers), a larger
layer in the activation arena, larger weights in the dequantization scratch, and the constant buffer of
hybrid_ops.py -- and the shapes the recurrent kernels refuse (flashd_recurrent.h), so such a model fails at load
with a message instead of at its first forward."""
from __future__ import annotations

from ...models.config import ModelConfig
from ...models.gguf_file import ModelUnsupported
from .recurrent_ops import CONV_MAX_K, DELTA_MAX_DK

__all__ = ["check_hybrid", "hybrid_state_bytes", "hybrid_tree_nodes", "hybrid_layer_bytes", "hybrid_largest_weight",
           "hybrid_workspace_bytes"]

F32 = 4
ALIGN = 256


def _up(n_floats: int) -> int:
    return (n_floats * F32 + ALIGN - 1) // ALIGN * ALIGN


def check_hybrid(cfg: ModelConfig) -> None:
    """ModelUnsupported for a linear-attention shape the conv / delta-rule kernels do not take."""
    lin = cfg.linear
    if lin.conv_kernel > CONV_MAX_K:
        raise ModelUnsupported(f"the CUDA causal_conv1d kernel takes up to {CONV_MAX_K} taps; this model's "
                               f"ssm.conv_kernel is {lin.conv_kernel} (use --device cpu)")
    if lin.head_dim > DELTA_MAX_DK:
        raise ModelUnsupported(f"the CUDA gated delta rule kernels take heads of up to {DELTA_MAX_DK}; this model's "
                               f"ssm.state_size is {lin.head_dim} (use --device cpu)")


def hybrid_state_bytes(cfg: ModelConfig) -> int:
    """The recurrent state of one sequence: conv (K - 1, C) and memory (Hv, S, S) float32 per linear layer."""
    lin = cfg.linear
    per_layer = (lin.conv_kernel - 1) * lin.conv_channels + lin.n_v_heads * lin.head_dim * lin.head_dim
    return len(lin.linear_layers) * per_layer * F32


def hybrid_tree_nodes(prefill_chunk: int, cap: int | None = None) -> int:
    """Nodes of the largest draft tree a verify takes (CudaHybridRunner.max_tree_nodes): a state each. cap: the
    runner's max_tree_nodes argument (None: MAX_TREE_NODES; 0: a model loaded only to draft, which verifies none)."""
    from ...models.qwen35_tree import MAX_TREE_NODES
    from .ops import MAX_MASKED_TOKENS
    return min(prefill_chunk, MAX_MASKED_TOKENS, MAX_TREE_NODES if cap is None else cap)


def hybrid_layer_bytes(cfg: ModelConfig, chunk: int) -> int:
    """Bytes one layer of a chunk of `chunk` tokens takes from the arena (the larger of a Gated DeltaNet layer and
    a gated attention layer), counting every take of models/qwen35.py on CudaOps with room to spare (an upper bound:
    the input norm is counted once per projection, as before the projections of one x became one linear_multi,
    which materializes it once, and the residual add is now the output projection's epilogue)."""
    lin, c = cfg.linear, chunk
    mlp = _up(c * cfg.hidden) * 4 + _up(c * cfg.ffn)                     # add, post-norm, swiglu, down
    linear = (_up(c * cfg.hidden) * 5                                    # materialized norms, ssm_out
              + _up(c * lin.conv_channels) * 3                           # conv in, conv out, silu
              + _up(c * lin.key_dim) * 4 + _up(c * lin.value_dim)        # split q, k, v; l2-normed q, k
              + _up(c * lin.n_v_heads) * 4                               # alpha, g, beta logits, beta
              + _up(c * lin.value_dim) * 4)                              # delta out, z, normed, gated
    attention = (_up(c * cfg.hidden) * 4                                 # materialized norms, o-proj
                 + _up(c * 2 * cfg.q_dim) + _up(c * cfg.kv_dim) * 3      # q|gate, k, v, normed k
                 + _up(c * cfg.q_dim) * 6)                               # split q, gate; normed q; attn; sigmoid; mul
    return max(linear, attention) + mlp


def hybrid_largest_weight(cfg: ModelConfig) -> int:
    """Elements of the largest projection the prefill GEMM dequantizes (attn_q holds query and gate)."""
    lin = cfg.linear
    return max(2 * cfg.q_dim * cfg.hidden, lin.conv_channels * cfg.hidden, lin.value_dim * cfg.hidden,
               cfg.ffn * cfg.hidden, cfg.kv_dim * cfg.hidden)


def hybrid_workspace_bytes(cfg: ModelConfig, chunk: int) -> int:
    """hybrid_ops.py's buffers outside the arena: l2_norm's weight, S floats (every other op takes from the arena;
    chunk changes nothing since ABI 13's fd_silu and fd_copy_cols replaced the ones and the split ids)."""
    return _up(cfg.linear.head_dim)
