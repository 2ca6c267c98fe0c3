"""A qwen35 file's multi-token-prediction (MTP, `nextn`) block: which block it is, its tensors, and loading them.

Qwen3.5 / 3.6 GGUFs may carry `{arch}.nextn_predict_layers` = 1 extra block after the trunk, stored as block
n_trunk = block_count - nextn_predict_layers (llama.cpp's load_block_mtp, src/models/qwen35.cpp of the llama.cpp in
llama-cpp-python 0.3.36). It holds a full-attention decoder block's tensors (the trunk's gated attention names and
shapes: AttentionLayerWeights) and

    blk.{n}.nextn.eh_proj           (D, 2 D)   projects [enorm(embed(token)) | hnorm(h)], the embedding's half first
    blk.{n}.nextn.enorm, .hnorm     (D,)       RMSNorm weights of the two halves
    blk.{n}.nextn.embed_tokens      (V, D)     optional: else the model's token_embd
    blk.{n}.nextn.shared_head_head  (V, D)     optional: else the model's lm_head (output, or token_embd when tied)
    blk.{n}.nextn.shared_head_norm  (D,)       optional: else the model's output_norm

The trunk's forward never runs the block (qwen35_config.py leaves it out of n_layers). flashd runs it as a drafter
(models/qwen35_mtp.py, speculative/mtp_drafter.py). Only one MTP block is supported (llama.cpp's graph asserts the
same); a file with more answers ModelLoadError when the MTP drafter is asked for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .config import ModelConfig
from .dflash_weights import split_columns
from .gguf_file import GGUFFile, ModelLoadError, TensorInfo
from .qwen35_weights import ATTENTION_TENSORS, AttentionLayerWeights

__all__ = ["MTPConfig", "MTPWeights", "mtp_config", "mtp_tensor_plan", "load_mtp_weights", "mtp_weight_bytes",
           "n_nextn_layers"]

# field -> (GGUF name, numpy shape given the target config), required tensors beside ATTENTION_TENSORS
MTP_TENSORS = {
    "eh_proj": ("blk.{i}.nextn.eh_proj.weight", lambda c: (c.hidden, 2 * c.hidden)),
    "enorm": ("blk.{i}.nextn.enorm.weight", lambda c: (c.hidden,)),
    "hnorm": ("blk.{i}.nextn.hnorm.weight", lambda c: (c.hidden,)),
}
# optional, with the target tensor each falls back to (ModelWeights field)
MTP_OPTIONAL = {
    "embed": ("blk.{i}.nextn.embed_tokens.weight", lambda c: (c.vocab_size, c.hidden), "token_embd"),
    "head": ("blk.{i}.nextn.shared_head_head.weight", lambda c: (c.vocab_size, c.hidden), "output"),
    "head_norm": ("blk.{i}.nextn.shared_head_norm.weight", lambda c: (c.hidden,), "output_norm"),
}


@dataclass(slots=True, frozen=True)
class MTPConfig:
    """The MTP block of a target: its block index and which optional tensors the file has (the rest of its shape
    is the target's ModelConfig: hidden, heads, head_dim, rope, ffn, vocab)."""

    layer: int                    # n_trunk: the block index of its tensors
    own: frozenset                # of "embed", "head", "head_norm": the file has the block's own tensor


@dataclass(slots=True)
class MTPWeights:
    block: AttentionLayerWeights  # the gated-attention decoder block (qwen35.decoder_layer runs it)
    eh_proj_e: Any                # (D, D): eh_proj's columns that read enorm(embed(token))
    eh_proj_h: Any                # (D, D): eh_proj's columns that read hnorm(h)
    enorm: Any
    hnorm: Any
    embed: Any                    # (V, D) nextn.embed_tokens or the target's token_embd
    head_norm: Any                # (D,) nextn.shared_head_norm or the target's output_norm
    head: Any                     # (V, D) nextn.shared_head_head or the target's lm_head


def n_nextn_layers(f: GGUFFile) -> int:
    return int(f.metadata(f"{f.arch}.nextn_predict_layers", 0))


def mtp_config(f: GGUFFile, cfg: ModelConfig) -> MTPConfig:
    """The MTP block of a qwen35 file (ModelLoadError when it has none, or more than one)."""
    n = n_nextn_layers(f)
    if cfg.linear is None or n == 0:
        raise ModelLoadError(f"{f.path.name}: the model has no multi-token-prediction (nextn) layers "
                             f"({f.arch}.nextn_predict_layers is {n}); the mtp drafter needs a qwen35 GGUF that "
                             "carries them")
    if n != 1:
        raise ModelLoadError(f"{f.path.name}: {n} MTP (nextn) blocks; only one is supported")
    layer = int(f.metadata(f"{f.arch}.block_count")) - n
    if layer != cfg.n_layers:
        raise ModelLoadError(f"{f.path.name}: the MTP block index {layer} != the trunk's {cfg.n_layers} layers")
    own = frozenset(field for field, (name, _, _) in MTP_OPTIONAL.items() if f.has_tensor(name.format(i=layer)))
    return MTPConfig(layer=layer, own=own)


def _checked(f: GGUFFile, name: str, shape: tuple[int, ...]) -> TensorInfo:
    info = f.tensor(name)
    if info.shape != shape:
        raise ModelLoadError(f"{f.path.name}: tensor {name!r} has shape {info.shape}, expected {shape}")
    return info


def mtp_tensor_plan(f: GGUFFile, cfg: ModelConfig, mcfg: MTPConfig) -> list[tuple[str, TensorInfo]]:
    """Every tensor of the block the file holds, checked: (field, info)."""
    plan = []
    for field, (name, shape, _) in ATTENTION_TENSORS.items():
        plan.append((field, _checked(f, name.format(i=mcfg.layer), shape(cfg))))
    for field, (name, shape) in MTP_TENSORS.items():
        plan.append((field, _checked(f, name.format(i=mcfg.layer), shape(cfg))))
    for field, (name, shape, _) in MTP_OPTIONAL.items():
        if field in mcfg.own:
            plan.append((field, _checked(f, name.format(i=mcfg.layer), shape(cfg))))
    return plan


def mtp_weight_bytes(f: GGUFFile, cfg: ModelConfig, mcfg: MTPConfig) -> int:
    return sum(info.n_bytes for _, info in mtp_tensor_plan(f, cfg, mcfg))


def load_mtp_weights(f: GGUFFile, cfg: ModelConfig, mcfg: MTPConfig, load: Callable[[TensorInfo], Any],
                     target_weights) -> MTPWeights:
    """Hand the block's tensors to `load` (the backend's weight loader); what the file lacks is the target's
    (target_weights: its ModelWeights, loaded). eh_proj is split into its two column halves (split_columns: cut
    between quantization blocks), so [e | h] @ eh_proj.T is eh_proj_e e + eh_proj_h h with no concatenation."""
    got: dict[str, Any] = {}
    for field, info in mtp_tensor_plan(f, cfg, mcfg):
        got[field] = [load(p) for p in split_columns(info, 2)] if field == "eh_proj" else load(info)
    block = AttentionLayerWeights(**{field: got[field] for field in ATTENTION_TENSORS})
    fallback = {field: got.get(field, getattr(target_weights, target)) for field, (_, _, target) in MTP_OPTIONAL.items()}
    return MTPWeights(block=block, eh_proj_e=got["eh_proj"][0], eh_proj_h=got["eh_proj"][1], enorm=got["enorm"],
                      hnorm=got["hnorm"], **fallback)
