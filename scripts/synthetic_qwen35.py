"""The `qwen35` architecture of a synthetic model (Qwen3.5 / Qwen3.6 hybrids): llama.cpp's tensor names, shapes
and metadata keys for it (src/llama-arch.cpp, src/models/qwen35.cpp of the llama.cpp vendored in
llama-cpp-python 0.3.36).

Layer i is a linear-attention (Gated DeltaNet) layer unless (i + 1) % full_attn_interval == 0, then it is a
full-attention layer. Numpy shapes (rows, cols), y = W @ x:

    every layer      attn_norm (D,), post_attention_norm (D,), ffn_gate/ffn_up (F, D), ffn_down (D, F)
    full attention   attn_q (2 H d, D): per head [query d | output gate d]; attn_k/attn_v (Hkv d, D);
                     attn_q_norm/attn_k_norm (d,); attn_output (D, H d)
    linear attention attn_qkv (2 Hk S + Hv S, D): the q, k, v channels of the convolution;
                     attn_gate (Hv S, D): z of the gated output norm; ssm_conv1d (2 Hk S + Hv S, K) F32;
                     ssm_dt.bias (Hv,); ssm_a (Hv,) = -exp(A_log), no suffix; ssm_alpha/ssm_beta (Hv, D);
                     ssm_norm (S,); ssm_out (D, Hv S)

S = ssm_state (the head size of keys and values), Hk = ssm_k_heads (ssm.group_count), Hv = ssm_v_heads
(ssm.time_step_rank), K = ssm_conv_kernel.

With spec.mtp the file also holds one multi-token-prediction block (llama.cpp's load_block_mtp), stored as block
n_layers after the trunk (block_count = n_layers + 1, nextn_predict_layers = 1): a full-attention block's tensors
(above) plus nextn.eh_proj (D, 2 D) (the projection of [enorm(embed) | hnorm(h)]), nextn.enorm (D,), nextn.hnorm
(D,), nextn.shared_head_norm (D,) and, with spec.mtp_own_head, nextn.embed_tokens (V, D) and
nextn.shared_head_head (V, D) (without them the block uses token_embd and output).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import gguf
from gguf.constants import MODEL_TENSOR

if TYPE_CHECKING:
    from flashd.scripts.make_synthetic_gguf import SyntheticSpec
    from flashd.scripts.synthetic_arch import TensorSlot

__all__ = ["qwen35_layer_tensors", "qwen35_metadata", "qwen35_check", "is_recurrent_layer", "rope_sections",
           "qwen35_mtp_tensors", "QWEN35_MTP_KINDS"]

# llama.cpp's qwen35 loads these (LLM_TENSOR_NEXTN_*); the gguf-py installed here does not list them for QWEN35
QWEN35_MTP_KINDS = (MODEL_TENSOR.NEXTN_EH_PROJ, MODEL_TENSOR.NEXTN_ENORM, MODEL_TENSOR.NEXTN_HNORM,
                    MODEL_TENSOR.NEXTN_EMBED_TOKENS, MODEL_TENSOR.NEXTN_SHARED_HEAD_HEAD,
                    MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM)


def is_recurrent_layer(spec: SyntheticSpec, bid: int) -> bool:
    return bid < spec.n_layers and (bid + 1) % spec.full_attn_interval != 0      # the MTP block is attention


def rope_sections(n_pairs: int) -> list[int]:
    """[t, h, w, 0] with t + h + w = n_pairs rotated pairs, split as Qwen3.5's [11, 11, 10] for 32: llama.cpp's
    interleaved M-RoPE then gives every rotated pair the token's position (text tokens have t = h = w)."""
    t = -(-n_pairs // 3)
    h = -(-(n_pairs - 1) // 3)
    return [t, h, n_pairs - t - h, 0]


def qwen35_check(spec: SyntheticSpec) -> None:
    """ValueError for a qwen35 spec llama.cpp would not load or that flashd cannot express."""
    for field in ("ssm_state", "ssm_k_heads", "ssm_v_heads", "ssm_conv_kernel", "full_attn_interval"):
        value = getattr(spec, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{field} must be a positive int for qwen35, got {value!r}")
    if spec.ssm_conv_kernel < 2:
        raise ValueError(f"ssm_conv_kernel must be >= 2, got {spec.ssm_conv_kernel}")
    if spec.ssm_v_heads % spec.ssm_k_heads:
        raise ValueError(f"ssm_v_heads ({spec.ssm_v_heads}) must be a multiple of ssm_k_heads ({spec.ssm_k_heads})")
    rope_dim = spec.rope_dim_resolved
    if rope_dim % 2 or not 0 < rope_dim <= spec.head_dim_resolved:
        raise ValueError(f"rope_dim ({rope_dim}) must be even and in (0, head_dim {spec.head_dim_resolved}]")


def qwen35_layer_tensors(spec: SyntheticSpec, bid: int) -> list[TensorSlot]:
    from flashd.scripts.synthetic_arch import TensorSlot

    T = MODEL_TENSOR
    D, F = spec.hidden, spec.ffn
    out = [TensorSlot(T.ATTN_NORM, "weight", (D,), "norm", bid)]
    if is_recurrent_layer(spec, bid):
        S, Hk, Hv = spec.ssm_state, spec.ssm_k_heads, spec.ssm_v_heads
        conv_dim = 2 * Hk * S + Hv * S
        out += [
            TensorSlot(T.ATTN_QKV, "weight", (conv_dim, D), "matrix", bid),
            TensorSlot(T.ATTN_GATE, "weight", (Hv * S, D), "matrix", bid),
            TensorSlot(T.SSM_CONV1D, "weight", (conv_dim, spec.ssm_conv_kernel), "conv", bid),
            TensorSlot(T.SSM_DT, "bias", (Hv,), "dt_bias", bid),
            TensorSlot(T.SSM_A, "", (Hv,), "ssm_a", bid),
            TensorSlot(T.SSM_BETA, "weight", (Hv, D), "matrix", bid),
            TensorSlot(T.SSM_ALPHA, "weight", (Hv, D), "matrix", bid),
            TensorSlot(T.SSM_NORM, "weight", (S,), "norm", bid),
            TensorSlot(T.SSM_OUT, "weight", (D, Hv * S), "out_matrix", bid),
        ]
    else:
        hd = spec.head_dim_resolved
        out += [
            TensorSlot(T.ATTN_Q, "weight", (2 * spec.n_heads * hd, D), "matrix", bid),
            TensorSlot(T.ATTN_K, "weight", (spec.n_kv_heads * hd, D), "matrix", bid),
            TensorSlot(T.ATTN_V, "weight", (spec.n_kv_heads * hd, D), "matrix", bid),
            TensorSlot(T.ATTN_Q_NORM, "weight", (hd,), "norm", bid),
            TensorSlot(T.ATTN_K_NORM, "weight", (hd,), "norm", bid),
            TensorSlot(T.ATTN_OUT, "weight", (D, spec.n_heads * hd), "out_matrix", bid),
        ]
    out += [
        TensorSlot(T.ATTN_POST_NORM, "weight", (D,), "norm", bid),
        TensorSlot(T.FFN_GATE, "weight", (F, D), "matrix", bid),
        TensorSlot(T.FFN_UP, "weight", (F, D), "matrix", bid),
        TensorSlot(T.FFN_DOWN, "weight", (D, F), "out_matrix", bid),
    ]
    return out


def qwen35_mtp_tensors(spec: SyntheticSpec) -> list[TensorSlot]:
    """The MTP block's tensors, block index n_layers (the module docstring)."""
    from flashd.scripts.synthetic_arch import TensorSlot

    T, D, bid = MODEL_TENSOR, spec.hidden, spec.n_layers
    out = qwen35_layer_tensors(spec, bid)           # a full-attention block (is_recurrent_layer: False)
    out += [
        TensorSlot(T.NEXTN_EH_PROJ, "weight", (D, 2 * D), "matrix", bid),
        TensorSlot(T.NEXTN_ENORM, "weight", (D,), "norm", bid),
        TensorSlot(T.NEXTN_HNORM, "weight", (D,), "norm", bid),
        TensorSlot(T.NEXTN_SHARED_HEAD_NORM, "weight", (D,), "norm", bid),
    ]
    if spec.mtp_own_head:
        out += [TensorSlot(T.NEXTN_EMBED_TOKENS, "weight", (spec.vocab_size, D), "embedding", bid),
                TensorSlot(T.NEXTN_SHARED_HEAD_HEAD, "weight", (spec.vocab_size, D), "lm_head", bid)]
    return out


def qwen35_metadata(writer: gguf.GGUFWriter, spec: SyntheticSpec) -> None:
    """The keys llama.cpp's qwen35 loader reads beyond the common ones (convert_hf_to_gguf writes the same)."""
    hd = spec.head_dim_resolved
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_dimension_count(spec.rope_dim_resolved)
    writer.add_rope_dimension_sections(rope_sections(spec.rope_dim_resolved // 2))
    writer.add_ssm_conv_kernel(spec.ssm_conv_kernel)
    writer.add_ssm_state_size(spec.ssm_state)
    writer.add_ssm_group_count(spec.ssm_k_heads)
    writer.add_ssm_time_step_rank(spec.ssm_v_heads)
    writer.add_ssm_inner_size(spec.ssm_v_heads * spec.ssm_state)
    writer.add_full_attention_interval(spec.full_attn_interval)
    if spec.mtp:
        writer.add_nextn_predict_layers(1)
