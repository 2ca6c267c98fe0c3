"""The architectures a synthetic model can have: the tensors of one block and the metadata keys that
distinguish llama, qwen2, qwen3 and qwen35 files (a new arch is one more entry in ARCH_LAYOUTS; qwen35's hybrid
blocks are in synthetic_qwen35.py).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gguf
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

from flashd.scripts.synthetic_qwen35 import QWEN35_MTP_KINDS, qwen35_check, qwen35_layer_tensors, qwen35_metadata

if TYPE_CHECKING:
    from flashd.scripts.make_synthetic_gguf import SyntheticSpec

__all__ = ["ARCH_LAYOUTS", "ArchLayout", "TensorSlot"]


@dataclass(slots=True, frozen=True)
class TensorSlot:
    """A tensor of the architecture before its type and distribution are decided."""

    kind: MODEL_TENSOR          # gguf.constants tensor kind (must belong to the arch)
    suffix: str                 # "weight" | "bias" | "" (no suffix: qwen35's ssm_a)
    shape: tuple[int, ...]      # numpy shape, rows first
    role: str                   # "embedding" | "matrix" | "out_matrix" (writes into the residual
                                # stream) | "lm_head" | "norm" | "bias" | "conv" (2-D, kept F32) | "dt_bias" |
                                # "ssm_a" (negative): picks the initial distribution
    bid: int | None = None      # block index for blk.N tensors

    @property
    def name(self) -> str:
        base = TENSOR_NAMES[self.kind].format(bid=self.bid)
        return f"{base}.{self.suffix}" if self.suffix else base


@dataclass(slots=True, frozen=True)
class ArchLayout:
    """What distinguishes one architecture's file; a new arch is one more entry in ARCH_LAYOUTS."""

    model_arch: gguf.MODEL_ARCH
    tokenizer_pre: str                                            # tokenizer.ggml.pre
    layer_tensors: Callable[[SyntheticSpec, int], list[TensorSlot]]  # the tensors of block `bid`
    write_arch_metadata: Callable[[gguf.GGUFWriter, SyntheticSpec], None]  # arch-specific keys
    check: Callable[[SyntheticSpec], None] | None = None          # ValueError for a spec the arch cannot have
    extra_kinds: tuple[MODEL_TENSOR, ...] = ()                    # kinds llama.cpp loads that the installed
                                                                  # gguf.constants does not list for the arch


def _dense_layer_tensors(spec: SyntheticSpec, bid: int, *, qkv_bias: bool, qk_norm: bool) -> list[TensorSlot]:
    """One pre-norm attention + SwiGLU block (llama / qwen2 / qwen3)."""
    T = MODEL_TENSOR
    hd = spec.head_dim_resolved
    q_dim, kv_dim = spec.n_heads * hd, spec.n_kv_heads * hd
    out = [TensorSlot(T.ATTN_NORM, "weight", (spec.hidden,), "norm", bid)]
    for kind, rows in ((T.ATTN_Q, q_dim), (T.ATTN_K, kv_dim), (T.ATTN_V, kv_dim)):
        out.append(TensorSlot(kind, "weight", (rows, spec.hidden), "matrix", bid))
        if qkv_bias:
            out.append(TensorSlot(kind, "bias", (rows,), "bias", bid))
    if qk_norm:   # RMSNorm over each head's hd values, one weight vector shared by all heads
        out.append(TensorSlot(T.ATTN_Q_NORM, "weight", (hd,), "norm", bid))
        out.append(TensorSlot(T.ATTN_K_NORM, "weight", (hd,), "norm", bid))
    out += [
        TensorSlot(T.ATTN_OUT, "weight", (spec.hidden, q_dim), "out_matrix", bid),
        TensorSlot(T.FFN_NORM, "weight", (spec.hidden,), "norm", bid),
        TensorSlot(T.FFN_GATE, "weight", (spec.ffn, spec.hidden), "matrix", bid),
        TensorSlot(T.FFN_UP, "weight", (spec.ffn, spec.hidden), "matrix", bid),
        TensorSlot(T.FFN_DOWN, "weight", (spec.hidden, spec.ffn), "out_matrix", bid),
    ]
    return out


def _write_head_dim_keys(writer: gguf.GGUFWriter, spec: SyntheticSpec) -> None:
    writer.add_key_length(spec.head_dim_resolved)
    writer.add_value_length(spec.head_dim_resolved)


def _llama_metadata(writer: gguf.GGUFWriter, spec: SyntheticSpec) -> None:
    # The llama converter also writes these two keys.
    writer.add_vocab_size(spec.vocab_size)
    writer.add_rope_dimension_count(spec.rope_dim_resolved)
    if spec.head_dim_resolved * spec.n_heads != spec.hidden:
        _write_head_dim_keys(writer, spec)


def _qwen2_metadata(writer: gguf.GGUFWriter, spec: SyntheticSpec) -> None:
    if spec.head_dim_resolved * spec.n_heads != spec.hidden:
        _write_head_dim_keys(writer, spec)


def _qwen3_metadata(writer: gguf.GGUFWriter, spec: SyntheticSpec) -> None:
    # Qwen3 configs carry head_dim, so the converter always writes key_length/value_length.
    _write_head_dim_keys(writer, spec)


ARCH_LAYOUTS: dict[str, ArchLayout] = {
    "llama": ArchLayout(
        gguf.MODEL_ARCH.LLAMA, "smollm",
        functools.partial(_dense_layer_tensors, qkv_bias=False, qk_norm=False), _llama_metadata),
    "qwen2": ArchLayout(
        gguf.MODEL_ARCH.QWEN2, "qwen2",
        functools.partial(_dense_layer_tensors, qkv_bias=True, qk_norm=False), _qwen2_metadata),
    "qwen3": ArchLayout(
        gguf.MODEL_ARCH.QWEN3, "qwen2",
        functools.partial(_dense_layer_tensors, qkv_bias=False, qk_norm=True), _qwen3_metadata),
    "qwen35": ArchLayout(gguf.MODEL_ARCH.QWEN35, "qwen2", qwen35_layer_tensors, qwen35_metadata, qwen35_check,
                         QWEN35_MTP_KINDS),
}
